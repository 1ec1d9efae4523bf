//! The Python the tests drive the edge with: a venv at `target/test-venv` holding
//! `tests/python/requirements.txt`.
//!
//! [`python`] creates the venv (`python3 -m venv`, or the interpreter named by
//! `EDGE_TEST_PYTHON3`) and pip-installs the requirements when the venv is missing or the
//! requirements changed since the last install (a marker file in the venv keeps their
//! SHA-256). An in-process `OnceLock` and a lock file make parallel tests and parallel test
//! binaries wait for one installer instead of racing. `.ci/run` installs the same venv
//! before `cargo test`, so CI never installs from inside a test.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use sha2::{Digest, Sha256};

/// The venv, relative to the crate root.
const VENV: &str = "target/test-venv";
/// The requirements, relative to the crate root.
const REQUIREMENTS: &str = "tests/python/requirements.txt";
/// Inside the venv: the SHA-256 of the requirements last installed.
const MARKER: &str = ".requirements.sha256";

/// The venv's Python interpreter, with the requirements installed. Panics, saying what
/// failed, when the venv cannot be created or the install fails.
pub fn python() -> PathBuf {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    super::deadline::installing(|| PYTHON.get_or_init(prepare).clone())
}

fn prepare() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let venv = root.join(VENV);
    let requirements = root.join(REQUIREMENTS);
    let wanted = fs::read(&requirements)
        .map(|text| hex(&Sha256::digest(&text)))
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", requirements.display()));
    let interpreter = interpreter(&venv);
    let marker = venv.join(MARKER);
    let installed = || {
        fs::read_to_string(&marker).is_ok_and(|hash| hash.trim() == wanted) && interpreter.exists()
    };
    if installed() {
        return interpreter;
    }

    // Another test binary may be installing right now: wait for it, then look again.
    let parent = venv.parent().expect("the venv has a parent directory");
    fs::create_dir_all(parent)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", parent.display()));
    let lock_path = parent.join("test-venv.lock");
    let lock = File::create(&lock_path)
        .unwrap_or_else(|e| panic!("cannot create {}: {e}", lock_path.display()));
    lock.lock()
        .unwrap_or_else(|e| panic!("cannot lock {}: {e}", lock_path.display()));
    if installed() {
        return interpreter;
    }

    if !interpreter.exists() {
        let base = std::env::var("EDGE_TEST_PYTHON3").unwrap_or_else(|_| "python3".to_owned());
        run(
            Command::new(&base).arg("-m").arg("venv").arg(&venv),
            &format!("{base} -m venv"),
        );
    }
    let _ = fs::remove_file(&marker);
    run(
        Command::new(&interpreter)
            .args([
                "-m",
                "pip",
                "install",
                "--disable-pip-version-check",
                "--quiet",
                "-r",
            ])
            .arg(&requirements),
        "pip install -r tests/python/requirements.txt",
    );
    fs::write(&marker, &wanted)
        .unwrap_or_else(|e| panic!("cannot write {}: {e}", marker.display()));
    interpreter
}

/// How long a client script may take (the venv is installed before it starts).
const SCRIPT_PATIENCE: Duration = Duration::from_secs(120);

/// `tests/python/<script>` with `args`, to run in the venv (installed first, off the
/// runtime), with no proxy and no ambient OpenAI or Anthropic settings, so the SDKs talk to
/// the edge only; killed if dropped.
pub async fn client_script(script: &str, args: &[&str]) -> tokio::process::Command {
    let python = tokio::task::spawn_blocking(python).await.expect("venv");
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/python")
        .join(script);
    let mut command = tokio::process::Command::new(&python);
    command.arg(&script).args(args);
    for ambient in [
        "OPENAI_BASE_URL",
        "OPENAI_API_KEY",
        "ANTHROPIC_BASE_URL",
        "ANTHROPIC_API_KEY",
        "ANTHROPIC_AUTH_TOKEN",
    ] {
        command.env_remove(ambient);
    }
    command.env("NO_PROXY", "*").kill_on_drop(true);
    command
}

/// Runs [`client_script`] to its end and returns what it printed. Panics with its output
/// unless it exits 0 and prints `ok` first: the scripts assert everything themselves.
pub async fn run_client_script(script: &str, args: &[&str]) -> String {
    let run = client_script(script, args).await.output();
    let output = tokio::time::timeout(SCRIPT_PATIENCE, run)
        .await
        .expect("the script finished in time")
        .expect("the script ran");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "{script} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        output.status
    );
    assert!(
        stdout.starts_with("ok"),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout.into_owned()
}

/// The interpreter inside `venv`.
fn interpreter(venv: &Path) -> PathBuf {
    if cfg!(windows) {
        venv.join("Scripts").join("python.exe")
    } else {
        venv.join("bin").join("python")
    }
}

/// Runs `command`, panicking with its output when it fails.
fn run(command: &mut Command, what: &str) {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
