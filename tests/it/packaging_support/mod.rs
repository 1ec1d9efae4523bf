//! What the packaging tests (`packaging.rs`) stand on: the tools `.ci/packaging/` installs
//! (cargo-deb, mmdebstrap's Debian roots, buildah, kubernetes-validate), the binaries
//! `cargo test --workspace` built, a throwaway Debian root to install the packages into, a
//! service started there exactly as its systemd unit says, and buildah on a storage of its
//! own. It runs programs and reads files; it never decides what a test asserts.

use std::ffi::OsString;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use crate::common;

/// The clone's root.
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The `edge` binary this test binary was built with (`target/<profile>/edge`).
pub fn edge_binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_edge"))
}

/// The `edge-node` binary beside it, which `cargo test --workspace` builds for the node's
/// own integration tests (`node/tests/cli.rs`).
pub fn node_binary() -> PathBuf {
    let binary = edge_binary().with_file_name("edge-node");
    assert!(
        binary.is_file(),
        "{} is missing: run `cargo test --workspace` (or `cargo build -p edge-node`) first",
        binary.display()
    );
    binary
}

/// The cargo profile the binaries were built with, as cargo-deb and release.sh name it.
pub fn profile() -> &'static str {
    let dir = edge_binary()
        .parent()
        .and_then(Path::file_name)
        .map(|name| name.to_string_lossy().into_owned());
    match dir.as_deref() {
        Some("debug") => "dev",
        Some("release") => "release",
        other => panic!("the edge binary is in an unexpected profile directory {other:?}"),
    }
}

/// Fails the test unless it runs as root, as CI does: installing packages into a root,
/// `chroot` and buildah's storage need it.
pub fn require_root() {
    let uid = run(Command::new("id").arg("-u"), "id -u");
    assert_eq!(
        uid.trim(),
        "0",
        "the packaging tests install packages into a throwaway root and build images: run \
         them as root (CI does)"
    );
}

/// Runs `.ci/packaging/{script} {args}` (which installs what is missing, into the tool cache
/// outside the clone) with the test's deadline stopped, and returns the path it prints last.
pub fn tool(script: &str, args: &[&str]) -> PathBuf {
    common::deadline::installing(|| {
        let path = repo().join(".ci/packaging").join(script);
        let output = Command::new("bash")
            .arg(&path)
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", path.display()));
        assert!(
            output.status.success(),
            "{} failed ({}); its messages are above",
            path.display(),
            output.status
        );
        let printed = String::from_utf8_lossy(&output.stdout);
        let last = PathBuf::from(printed.lines().last().unwrap_or_default().trim());
        assert!(
            last.exists(),
            "{script} printed {}, which is not there",
            last.display()
        );
        last
    })
}

/// cargo-deb at the pinned version.
pub fn cargo_deb() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| tool("cargo-deb.sh", &[])).clone()
}

/// Runs `command`, fails naming `what` and its output unless it succeeds, returns stdout.
pub fn run(command: &mut Command, what: &str) -> String {
    let output = command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    assert!(
        output.status.success(),
        "{what} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// `command`'s output, whatever its status.
pub fn output(command: &mut Command, what: &str) -> Output {
    command
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"))
}

/// Builds the Debian package of workspace package `package` from the binaries the tests
/// were built with (no build of its own), with Debian revision `revision`, into `out`, and
/// returns its path. Releases build with `--release` instead (docs/install.md).
pub fn build_deb(package: &str, revision: &str, out: &Path) -> PathBuf {
    let stdout = run(
        Command::new(cargo_deb())
            .current_dir(repo())
            .args([
                "--no-build",
                "--fast",
                "--profile",
                profile(),
                "-p",
                package,
            ])
            .args(["--deb-revision", revision, "--output"])
            .arg(out),
        &format!("cargo-deb -p {package}"),
    );
    let deb = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
    assert!(deb.is_file(), "cargo-deb printed {stdout:?}, not a package");
    deb
}

/// A free loopback port: bound, then released for a process to take.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("bind a free loopback port")
}

/// A file's mode bits (`0o640`), owner and group ids.
pub fn mode_and_owner(path: &Path) -> (u32, u32, u32) {
    let meta = fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (meta.permissions().mode() & 0o7777, meta.uid(), meta.gid())
}

/// The `Key=Value` lines of a systemd unit's sections, in order (comments aside).
pub struct Unit(Vec<(String, String)>);

impl Unit {
    /// Reads the unit file at `path`.
    pub fn read(path: &Path) -> Self {
        let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        Self(
            text.lines()
                .map(str::trim)
                .filter(|line| !line.starts_with(['#', ';', '[']))
                .filter_map(|line| line.split_once('='))
                .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
                .collect(),
        )
    }

    /// Every value of `key`.
    pub fn all(&self, key: &str) -> Vec<&str> {
        self.0
            .iter()
            .filter(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .collect()
    }

    /// The last value of `key`, as systemd takes it.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.all(key).last().copied()
    }
}

/// `KEY=VALUE` lines of an environment file, as systemd's `EnvironmentFile=` reads them
/// (comments and blank lines aside, surrounding quotes taken off).
pub fn environment_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with(['#', ';']))
        .filter_map(|line| line.split_once('='))
        .map(|(key, value)| {
            let value = value.trim();
            let unquoted = value
                .strip_prefix('"')
                .and_then(|v| v.strip_suffix('"'))
                .unwrap_or(value);
            (key.trim().to_owned(), unquoted.to_owned())
        })
        .collect()
}

/// A throwaway Debian root (a tarball of `.ci/packaging/base-rootfs.sh` unpacked), to
/// install the packages into and run them in with `chroot`; removed on drop.
pub struct DebianRoot {
    dir: tempfile::TempDir,
}

/// A user of a root's `/etc/passwd`.
#[derive(Debug)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
}

impl DebianRoot {
    /// Unpacks `tarball` into a new temporary directory.
    pub fn unpack(tarball: &Path) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory for the root");
        run(
            Command::new("tar")
                .arg("-xf")
                .arg(tarball)
                .arg("-C")
                .arg(dir.path()),
            "unpacking the Debian root",
        );
        Self { dir }
    }

    /// The root's directory on this machine.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `absolute` (a path inside the root) on this machine.
    pub fn path(&self, absolute: &str) -> PathBuf {
        self.dir.path().join(absolute.trim_start_matches('/'))
    }

    /// `chroot ROOT args…`, as root.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("/usr/sbin/chroot");
        command
            .env_clear()
            .env("PATH", SERVICE_PATH)
            .arg(self.dir())
            .args(args);
        command
    }

    /// `dpkg -i` of `debs` inside the root (copied into its /tmp first); returns dpkg's
    /// output.
    pub fn dpkg_install(&self, debs: &[&Path]) -> String {
        let mut inside = Vec::new();
        for deb in debs {
            let name = deb
                .file_name()
                .expect("a file")
                .to_string_lossy()
                .into_owned();
            fs::copy(deb, self.path(&format!("/tmp/{name}"))).expect("copy the package");
            inside.push(format!("/tmp/{name}"));
        }
        let mut args = vec!["dpkg", "-i"];
        args.extend(inside.iter().map(String::as_str));
        let mut command = self.command(&args);
        command.env("DEBIAN_FRONTEND", "noninteractive");
        let out = output(&mut command, "dpkg -i in the root");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "dpkg -i {inside:?} failed:\n{text}");
        text
    }

    /// The root's user `name`, if it has one.
    pub fn user(&self, name: &str) -> Option<User> {
        let passwd = fs::read_to_string(self.path("/etc/passwd")).expect("/etc/passwd");
        passwd.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() == 7 && fields[0] == name).then(|| User {
                uid: fields[2].parse().expect("a uid"),
                gid: fields[3].parse().expect("a gid"),
                home: fields[5].to_owned(),
                shell: fields[6].to_owned(),
            })
        })
    }

    /// The root's group `name`'s id, if it has one.
    pub fn group(&self, name: &str) -> Option<u32> {
        let groups = fs::read_to_string(self.path("/etc/group")).expect("/etc/group");
        groups.lines().find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.len() >= 3 && fields[0] == name).then(|| fields[2].parse().expect("a gid"))
        })
    }

    /// The installed unit `name` (`edge.service`) started as systemd would start it: its
    /// `ExecStart=` (with `$VAR` words expanded), as its `User=`, in its
    /// `WorkingDirectory=`, with the environment systemd gives it (its `Environment=` and
    /// `EnvironmentFile=`, `$STATE_DIRECTORY` made for its `StateDirectory=` and owned by its
    /// user, `$NOTIFY_SOCKET` for `Type=notify`, and the user's `HOME`, `USER`, `LOGNAME`,
    /// `SHELL`), its output into `log`. Killed on drop.
    pub fn start_unit(
        &self,
        name: &str,
        notify_socket: Option<&str>,
        log: &Path,
    ) -> tokio::process::Child {
        let unit = Unit::read(&self.path(&format!("/usr/lib/systemd/system/{name}")));
        let user_name = unit.get("User").unwrap_or("root");
        let user = self
            .user(user_name)
            .unwrap_or_else(|| panic!("{name} runs as {user_name}, whom the root lacks"));
        let mut env = vec![
            ("PATH".to_owned(), SERVICE_PATH.to_owned()),
            ("HOME".to_owned(), user.home.clone()),
            ("USER".to_owned(), user_name.to_owned()),
            ("LOGNAME".to_owned(), user_name.to_owned()),
            ("SHELL".to_owned(), user.shell.clone()),
        ];
        if let Some(state) = unit.get("StateDirectory") {
            let dir = format!("/var/lib/{state}");
            let mode = unit
                .get("StateDirectoryMode")
                .map_or(0o755, |m| u32::from_str_radix(m, 8).expect("an octal mode"));
            let host = self.path(&dir);
            fs::create_dir_all(&host).expect("the state directory");
            std::os::unix::fs::chown(&host, Some(user.uid), Some(user.gid)).expect("chown");
            fs::set_permissions(&host, fs::Permissions::from_mode(mode)).expect("chmod");
            env.push(("STATE_DIRECTORY".to_owned(), dir));
        }
        for file in unit.all("EnvironmentFile") {
            let text = fs::read_to_string(self.path(file.trim_start_matches('-')))
                .unwrap_or_else(|e| panic!("{name}'s EnvironmentFile {file}: {e}"));
            env.extend(environment_file(&text));
        }
        for assignment in unit.all("Environment") {
            env.extend(environment_file(assignment));
        }
        if unit.get("Type") == Some("notify") {
            let socket = notify_socket.expect("a Type=notify unit is given a NOTIFY_SOCKET");
            env.push(("NOTIFY_SOCKET".to_owned(), socket.to_owned()));
        }
        let cwd = unit
            .get("WorkingDirectory")
            .map_or("/".to_owned(), |dir| dir.replace("%S", "/var/lib"));
        let exec = expand(unit.get("ExecStart").expect("an ExecStart"), &env);
        let log_file = fs::File::create(log).expect("the service's log");
        let mut command = tokio::process::Command::new("/usr/sbin/chroot");
        command
            .env_clear()
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .arg(format!("--userspec={}:{}", user.uid, user.gid))
            .arg(self.dir())
            // chroot starts in /: the unit's working directory, then its command in place
            // of the shell (so the child's pid is the service's).
            .args(["/bin/sh", "-c", "cd \"$1\" && shift && exec \"$@\"", "sh"])
            .arg(cwd)
            .args(exec)
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("the log"))
            .stderr(log_file)
            .kill_on_drop(true);
        command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"))
    }
}

/// The `PATH` systemd gives services.
const SERVICE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// An `ExecStart=` line's words, `$NAME` expanded to the variable's words (none when unset
/// or empty) and `${NAME}` to its value as one word, as systemd does.
fn expand(exec: &str, env: &[(String, String)]) -> Vec<OsString> {
    let value = |name: &str| {
        env.iter()
            .rev()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.clone())
    };
    exec.split_whitespace()
        .flat_map(|word| {
            if let Some(name) = word.strip_prefix("${").and_then(|w| w.strip_suffix('}')) {
                vec![OsString::from(value(name).unwrap_or_default())]
            } else if let Some(name) = word.strip_prefix('$') {
                value(name)
                    .unwrap_or_default()
                    .split_whitespace()
                    .map(OsString::from)
                    .collect()
            } else {
                vec![OsString::from(word)]
            }
        })
        .collect()
}

/// buildah on a storage of its own (vfs, in a temporary directory removed on drop): the
/// images it builds never meet the machine's.
pub struct Buildah {
    dir: tempfile::TempDir,
}

impl Buildah {
    /// A new, empty storage; installs buildah when missing.
    pub fn new() -> Self {
        tool("image-tools.sh", &[]);
        Self {
            dir: tempfile::tempdir().expect("a temporary directory for buildah's storage"),
        }
    }

    /// `buildah --root … --runroot … --storage-driver vfs ARGS`.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("buildah");
        command
            .arg("--root")
            .arg(self.dir.path().join("storage"))
            .arg("--runroot")
            .arg(self.dir.path().join("run"))
            .args(["--storage-driver", "vfs"])
            .args(args);
        command
    }

    /// Runs `buildah ARGS`, failing naming it unless it succeeds; returns stdout, trimmed.
    pub fn run(&self, args: &[&str]) -> String {
        run(
            &mut self.command(args),
            &format!("buildah {}", args.join(" ")),
        )
        .trim()
        .to_owned()
    }

    /// Imports the root file system `tarball` as the local image `name`.
    pub fn import(&self, tarball: &Path, name: &str) {
        let container = self.run(&["from", "scratch"]);
        run(
            self.command(&["add", &container]).arg(tarball).arg("/"),
            "buildah add of the base's tarball",
        );
        self.run(&["commit", "--quiet", &container, name]);
        self.run(&["rm", &container]);
    }

    /// The image `name`'s Docker config (`User`, `Entrypoint`, `Healthcheck`, …).
    pub fn config(&self, name: &str) -> serde_json::Value {
        let text = self.run(&["inspect", "--type", "image", name]);
        let inspected: serde_json::Value = serde_json::from_str(&text).expect("inspect's JSON");
        inspected["Docker"]["config"].clone()
    }
}
