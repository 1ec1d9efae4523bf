//! Issue 65, the operator's ways in (docs/install.md), each built and run end to end:
//!
//! - the Debian packages (cargo-deb, from the binaries this test binary was built with),
//!   installed with `dpkg -i` into a throwaway Debian root made by mmdebstrap: files, users
//!   and conffiles in place, `systemd-analyze verify` clean on both units, the edge and the
//!   node started there exactly as their units start them (user, environment, working
//!   directory; the edge tells `READY=1` on `$NOTIFY_SOCKET`), one chat completion answered
//!   by the tests' llama-server through the installed binaries, and an upgrade (a higher
//!   `--deb-revision`) that keeps the operator's edited `/etc/edge/edge.toml`;
//! - the container images, built by buildah (`--isolation chroot`) from the Containerfile on
//!   a base made locally by mmdebstrap (this machine reaches no image registry and runs no
//!   containers), checked without a runtime: their config from `buildah inspect`, and the
//!   binaries run by `chroot` from the mounted image (`--version`, `check-config`, `serve`
//!   answering `/healthz`, the image's own health check);
//! - the Kubernetes manifests, valid against the schemas (PyPI's kubernetes-validate), the
//!   site's config they carry refused until its example tokens are replaced, and a node
//!   started with exactly the variables the DaemonSet gives it registering as its machine;
//! - the release archive (`packaging/release.sh`) with its SHA256SUMS, unpacked elsewhere
//!   and serving on its own config;
//! - and the edge binary's parts of it: `READY=1`/`STOPPING=1`, `edge healthcheck`, example
//!   tokens refused off loopback.
//!
//! The tools come from `.ci/packaging/` (cached outside the clone; installing them does not
//! count against a test's deadline). The tests need root, as CI runs them.

use crate::common;
use crate::packaging_support as support;

use std::os::linux::net::SocketAddrExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::engines::{LlamaServer, TINY_REPLY};
use common::{bounded, eventually_ok, http_client, watch_stderr};
use support::{DebianRoot, Unit, free_port, mode_and_owner, repo, run};

/// A Unix datagram socket at a fresh abstract name, as systemd's `$NOTIFY_SOCKET` (reachable
/// from a `chroot`, which has no say over abstract names).
struct NotifySocket {
    name: String,
    socket: tokio::net::UnixDatagram,
}

impl NotifySocket {
    fn new(what: &str) -> Self {
        let name = format!("edge-test-notify-{what}-{}", std::process::id());
        let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
            .expect("an abstract socket address");
        let socket = std::os::unix::net::UnixDatagram::bind_addr(&address).expect("bind it");
        socket.set_nonblocking(true).expect("non-blocking");
        Self {
            name: format!("@{name}"),
            socket: tokio::net::UnixDatagram::from_std(socket).expect("a tokio socket"),
        }
    }

    /// The next notice sent to it.
    async fn next(&self, what: &str) -> String {
        let mut buffer = [0_u8; 256];
        let n = bounded(
            format!("the edge's {what} notice"),
            self.socket.recv(&mut buffer),
        )
        .await
        .expect("a notice");
        String::from_utf8_lossy(&buffer[..n]).into_owned()
    }
}

/// Waits until `GET url` answers 200 and returns the body.
async fn answers_200(what: &str, url: &str) -> String {
    let client = http_client();
    eventually_ok(what, || {
        let request = client.get(url).send();
        async move {
            let response = request.await.map_err(|e| e.to_string())?;
            let status = response.status();
            let body = response.text().await.map_err(|e| e.to_string())?;
            if status.is_success() {
                Ok(body)
            } else {
                Err(format!("{status}: {body}"))
            }
        }
    })
    .await
}

/// Waits until `GET url` answers 200 with a body containing `needle`, and returns the body.
async fn answers_with(what: &str, url: &str, needle: &str) -> String {
    let client = http_client();
    eventually_ok(what, || {
        let request = client.get(url).send();
        async move {
            let response = request.await.map_err(|e| e.to_string())?;
            let status = response.status();
            let body = response.text().await.map_err(|e| e.to_string())?;
            if status.is_success() && body.contains(needle) {
                Ok(body)
            } else {
                Err(format!("{status}: {body}"))
            }
        }
    })
    .await
}

/// `future`'s output; if it panics, the services' `logs` are printed first (a failed wait on
/// a packaged service says what the service said).
async fn or_logs<T>(future: impl std::future::Future<Output = T>, logs: &[&Path]) -> T {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(future).catch_unwind().await {
        Ok(value) => value,
        Err(panic) => {
            for log in logs {
                eprintln!("--- {}:\n{}", log.display(), log_text(log));
            }
            std::panic::resume_unwind(panic)
        }
    }
}

/// SIGTERM to `child`, then its exit status (bounded).
async fn terminate(child: &mut tokio::process::Child, what: &str) -> std::process::ExitStatus {
    let pid = child.id().unwrap_or_else(|| panic!("{what} is running"));
    run(
        Command::new("kill").args(["-TERM", &pid.to_string()]),
        &format!("kill -TERM {what}"),
    );
    bounded(format!("{what} to exit after SIGTERM"), child.wait())
        .await
        .expect("its exit status")
}

/// A log file's text, for failure messages.
fn log_text(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `token = "…"` and `token_sha256 = "…"` from `edge token generate`'s output.
fn generated_token(output: &str) -> (String, String) {
    let value = |key: &str| {
        output
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{key} = \"")))
            .and_then(|rest| rest.strip_suffix('"'))
            .unwrap_or_else(|| panic!("`edge token generate` printed no {key}: {output}"))
            .to_owned()
    };
    (value("token"), value("token_sha256"))
}

#[crate::common::test(deadline_secs = 900)]
async fn the_debian_packages_install_serve_a_chat_as_their_units_and_an_upgrade_keeps_the_edited_config()
 {
    support::require_root();
    support::node_binary();
    let tarball = support::tool("base-rootfs.sh", &["systemd"]);
    let debs = tempfile::tempdir().expect("a directory for the packages");
    let edge_deb = support::build_deb("edge", "1", debs.path());
    let node_deb = support::build_deb("edge-node", "1", debs.path());
    for (deb, name) in [(&edge_deb, "edge_"), (&node_deb, "edge-node_")] {
        let file = deb.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            file.starts_with(name) && file.ends_with("-1_amd64.deb"),
            "{file}"
        );
        eprintln!(
            "packaging: {file}: {} KiB",
            std::fs::metadata(deb).unwrap().len() / 1024
        );
    }

    // Installed into a throwaway Debian root with systemd (as a machine has it).
    let root = DebianRoot::unpack(&tarball);
    root.dpkg_install(&[&edge_deb, &node_deb]);
    let edge_user = root.user("edge").expect("the package made the user edge");
    let node_user = root
        .user("edge-node")
        .expect("the package made the user edge-node");
    for user in [&edge_user, &node_user] {
        assert!(user.uid < 1000, "a system user: {user:?}");
        assert!(user.shell.ends_with("nologin"), "no login: {user:?}");
    }
    assert_eq!(edge_user.home, "/var/lib/edge");
    let edge_group = root.group("edge").expect("the group edge");
    for binary in ["/usr/bin/edge", "/usr/bin/edge-node"] {
        assert_eq!(
            mode_and_owner(&root.path(binary)),
            (0o755, 0, 0),
            "{binary}"
        );
    }
    assert_eq!(
        mode_and_owner(&root.path("/etc/edge/edge.toml")),
        (0o640, 0, edge_group),
        "the config is root's, readable by the group edge"
    );
    assert_eq!(
        mode_and_owner(&root.path("/etc/edge/node.env")),
        (0o600, 0, 0),
        "the node's settings are root's alone"
    );
    let conffiles = run(
        &mut root.command(&[
            "dpkg-query",
            "-W",
            "-f",
            "${Conffiles}\n",
            "edge",
            "edge-node",
        ]),
        "dpkg-query",
    );
    for conffile in ["/etc/edge/edge.toml", "/etc/edge/node.env"] {
        assert!(conffiles.contains(conffile), "{conffile}: {conffiles}");
    }
    for file in [
        "/usr/share/doc/edge/LICENSE-MIT",
        "/usr/share/doc/edge/LICENSE-APACHE",
        "/usr/share/doc/edge/install.md",
        "/usr/share/doc/edge-node/node.md",
    ] {
        assert!(root.path(file).is_file(), "{file} is installed");
    }
    // The symlinks systemctl enable makes point inside the root: read, never followed here.
    let wants = |unit: &str| {
        std::fs::read_link(root.path(&format!(
            "/etc/systemd/system/multi-user.target.wants/{unit}"
        )))
        .ok()
    };
    assert!(
        wants("edge.service").is_some_and(|target| target.ends_with("edge.service")),
        "edge.service is enabled on install"
    );
    assert_eq!(
        wants("edge-node.service"),
        None,
        "edge-node.service waits for its token before it is enabled"
    );
    for unit in ["edge.service", "edge-node.service"] {
        let verified = support::output(
            Command::new("systemd-analyze")
                .arg("verify")
                .arg(format!("--root={}", root.dir().display()))
                .arg(format!("/usr/lib/systemd/system/{unit}")),
            "systemd-analyze verify",
        );
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&verified.stdout),
            String::from_utf8_lossy(&verified.stderr)
        );
        assert!(
            verified.status.success() && said.trim().is_empty(),
            "systemd-analyze verify {unit}: {said}"
        );
    }

    // The operator's edits: a node with its token's digest, ports of this test's own.
    let engine = LlamaServer::start().await;
    let generated = run(
        &mut root.command(&["/usr/bin/edge", "token", "generate"]),
        "edge token generate",
    );
    let (token, digest) = generated_token(&generated);
    let (node_port, http_port, admin_port) = (free_port(), free_port(), free_port());
    let config_path = root.path("/etc/edge/edge.toml");
    let shipped = std::fs::read_to_string(&config_path).expect("the installed config");
    let edited = shipped
        .replace(
            "listen = \"127.0.0.1:7100\"",
            &format!("listen = \"127.0.0.1:{node_port}\""),
        )
        .replace(
            "listen = \"127.0.0.1:8080\"",
            &format!("listen = \"127.0.0.1:{http_port}\""),
        )
        .replace(
            "listen = \"127.0.0.1:8081\"",
            &format!("listen = \"127.0.0.1:{admin_port}\""),
        )
        + &format!(
            "\n[[nodes]]\nid = \"box-1\"\nalias = \"box-1\"\ntoken_sha256 = \"{digest}\"\n\
             [[nodes.adapters]]\nname = \"llama\"\ntargets = [\"tiny\"]\n\
             [nodes.adapters.settings]\nbase_url = \"{}\"\navailability = \"reachable\"\n",
            engine.v1_url()
        );
    for port in [node_port, http_port, admin_port] {
        assert!(
            edited.contains(&format!("127.0.0.1:{port}\"")),
            "port {port} set"
        );
    }
    std::fs::write(&config_path, &edited).expect("edit the config");
    let env_path = root.path("/etc/edge/node.env");
    let node_env = std::fs::read_to_string(&env_path)
        .expect("the installed node.env")
        .replace(
            "EDGE_NODE_EDGE=127.0.0.1:7100",
            &format!("EDGE_NODE_EDGE=127.0.0.1:{node_port}"),
        )
        .replace(
            "EDGE_NODE_TOKEN=example-token-CHANGE-ME",
            &format!("EDGE_NODE_TOKEN={token}"),
        );
    assert!(
        node_env.contains(&format!("EDGE_NODE_TOKEN={token}"))
            && node_env.contains(&format!("EDGE_NODE_EDGE=127.0.0.1:{node_port}")),
        "node.env has the edge's address and the token: {node_env}"
    );
    std::fs::write(&env_path, node_env).expect("edit node.env");

    // Both services as their units start them; the edge says when it is ready.
    let logs = tempfile::tempdir().expect("a directory for the logs");
    let notify = NotifySocket::new("deb");
    let edge_log = logs.path().join("edge.log");
    let mut edge = root.start_unit("edge.service", Some(&notify.name), &edge_log);
    assert_eq!(
        notify.next("ready").await,
        "READY=1",
        "{}",
        log_text(&edge_log)
    );
    let base = format!("http://127.0.0.1:{http_port}");
    assert_eq!(
        answers_200("/healthz", &format!("{base}/healthz")).await,
        "ok\n"
    );
    assert!(
        log_text(&edge_log).contains("journal=/var/lib/edge/journal.sqlite3"),
        "the journal lands in $STATE_DIRECTORY: {}",
        log_text(&edge_log)
    );
    let node_log = logs.path().join("edge-node.log");
    let mut node = root.start_unit("edge-node.service", None, &node_log);
    let models = format!("{base}/v1/models");
    let served = answers_with(
        "llama/tiny to be served through the installed node",
        &models,
        "llama/tiny",
    );
    or_logs(served, &[&edge_log, &node_log]).await;
    let chat: serde_json::Value = http_client()
        .post(format!("{base}/v1/chat/completions"))
        .json(&serde_json::json!({
            "model": "llama/tiny",
            "messages": [{"role": "user", "content": "hello"}]
        }))
        .send()
        .await
        .expect("the chat request")
        .json()
        .await
        .expect("the chat answer");
    assert_eq!(
        chat["choices"][0]["message"]["content"],
        TINY_REPLY,
        "{chat}; edge: {}; node: {}",
        log_text(&edge_log),
        log_text(&node_log)
    );
    assert!(terminate(&mut node, "edge-node").await.success());
    assert!(terminate(&mut edge, "edge").await.success());
    assert_eq!(notify.next("stopping").await, "STOPPING=1");
    assert!(root.path("/var/lib/edge/journal.sqlite3").is_file());

    // An upgrade to a higher revision keeps the operator's config, and serves it.
    let upgrade = support::build_deb("edge", "2", debs.path());
    root.dpkg_install(&[&upgrade]);
    let version = run(
        &mut root.command(&["dpkg-query", "-W", "-f", "${Version}", "edge"]),
        "dpkg-query",
    );
    assert!(version.ends_with("-2"), "upgraded to revision 2: {version}");
    assert_eq!(
        std::fs::read_to_string(&config_path).expect("the config"),
        edited,
        "the upgrade kept the edited config"
    );
    assert!(!root.path("/etc/edge/edge.toml.dpkg-dist").exists());
    assert_eq!(
        mode_and_owner(&config_path),
        (0o640, 0, edge_group),
        "and its mode"
    );
    let mut edge = root.start_unit("edge.service", Some(&notify.name), &edge_log);
    assert_eq!(
        notify.next("ready").await,
        "READY=1",
        "{}",
        log_text(&edge_log)
    );
    answers_200("/healthz after the upgrade", &format!("{base}/healthz")).await;
    assert!(terminate(&mut edge, "edge").await.success());

    // A purge takes the config and the state; the users stay (Debian's policy).
    run(
        &mut root.command(&["dpkg", "--purge", "edge", "edge-node"]),
        "dpkg --purge",
    );
    assert!(!config_path.exists() && !root.path("/usr/bin/edge").exists());
    assert!(
        !root.path("/var/lib/edge").exists(),
        "the journal is purged"
    );
    assert!(root.user("edge").is_some());
}

/// Copies what the Containerfile needs into a build context of its own, the tests'
/// binaries (their debug sections stripped) where release builds put theirs.
fn image_context() -> tempfile::TempDir {
    let context = tempfile::tempdir().expect("a build context");
    for file in [
        "Containerfile",
        ".containerignore",
        "packaging/edge.toml",
        "README.md",
        "LICENSE-MIT",
        "LICENSE-APACHE",
    ] {
        let to = context.path().join(file);
        std::fs::create_dir_all(to.parent().unwrap()).unwrap();
        std::fs::copy(repo().join(file), &to).unwrap_or_else(|e| panic!("{file}: {e}"));
    }
    let bin = context.path().join("target/release");
    std::fs::create_dir_all(&bin).unwrap();
    for binary in [support::edge_binary(), support::node_binary()] {
        run(
            Command::new("objcopy")
                .arg("--strip-debug")
                .arg(&binary)
                .arg(bin.join(binary.file_name().unwrap())),
            "objcopy --strip-debug",
        );
    }
    context
}

/// The `KEY=VALUE` entries of an image's `Env`.
fn image_env(config: &serde_json::Value) -> Vec<(String, String)> {
    config["Env"]
        .as_array()
        .expect("an Env")
        .iter()
        .filter_map(|entry| entry.as_str()?.split_once('='))
        .map(|(key, value)| (key.to_owned(), value.to_owned()))
        .collect()
}

/// `chroot` into the mounted image `rootfs` as `user` (`UID:GID`), in `workdir`, with `env`.
fn in_image(rootfs: &Path, user: &str, workdir: &str, env: &[(String, String)]) -> Command {
    let mut command = Command::new("/usr/sbin/chroot");
    command
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .arg(format!("--userspec={user}"))
        .arg(rootfs)
        .args([
            "/bin/sh",
            "-c",
            "cd \"$1\" && shift && exec \"$@\"",
            "sh",
            workdir,
        ]);
    command
}

/// The numeric `UID:GID` of `name` in the image's `/etc/passwd`.
fn image_user(rootfs: &Path, name: &str) -> String {
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).expect("the image's passwd");
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields[0] == name).then(|| format!("{}:{}", fields[2], fields[3]))
        })
        .unwrap_or_else(|| panic!("the image has no user {name}"))
}

#[crate::common::test(deadline_secs = 600)]
async fn the_images_run_as_non_root_users_keep_state_in_a_volume_and_their_binaries_serve() {
    support::require_root();
    let base = support::tool("base-rootfs.sh", &["minbase"]);
    let buildah = support::Buildah::new();
    buildah.import(&base, "localhost/edge-base:bookworm");
    let context = image_context();
    let context_dir = context.path().to_str().expect("a UTF-8 path");
    for (target, tag) in [
        ("edge", "localhost/edge:test"),
        ("edge-node", "localhost/edge-node:test"),
    ] {
        buildah.run(&[
            "bud",
            "--isolation",
            "chroot",
            "--format",
            "docker",
            "--quiet",
            "--build-arg",
            "BASE=localhost/edge-base:bookworm",
            "--target",
            target,
            "-t",
            tag,
            "-f",
            "Containerfile",
            context_dir,
        ]);
    }
    eprintln!(
        "packaging: images: {}",
        buildah
            .run(&["images", "--format", "{{.Name}}:{{.Tag}} {{.Size}}"])
            .replace('\n', "; ")
    );

    // What a runtime would read.
    let config = buildah.config("localhost/edge:test");
    assert_eq!(config["User"], "edge", "{config}");
    assert_eq!(config["Entrypoint"], serde_json::json!(["/usr/bin/edge"]));
    assert_eq!(
        config["Cmd"],
        serde_json::json!(["serve", "--config", "/etc/edge/edge.toml"])
    );
    for port in ["7100/tcp", "8080/tcp"] {
        assert!(
            config["ExposedPorts"].get(port).is_some(),
            "{port}: {config}"
        );
    }
    assert!(config["Volumes"].get("/var/lib/edge").is_some(), "{config}");
    let check = config["Healthcheck"]["Test"]
        .as_array()
        .expect("a health check")
        .clone();
    assert_eq!(check[0], "CMD");
    assert_eq!(
        check[1..3],
        [
            serde_json::json!("/usr/bin/edge"),
            serde_json::json!("healthcheck")
        ]
    );
    let node_config = buildah.config("localhost/edge-node:test");
    assert_eq!(node_config["User"], "edge-node", "{node_config}");
    assert_eq!(
        node_config["Entrypoint"],
        serde_json::json!(["/usr/bin/edge-node"])
    );

    // The edge image's own files, run without a runtime.
    let container = buildah.run(&["from", "--quiet", "localhost/edge:test"]);
    let rootfs = PathBuf::from(buildah.run(&["mount", &container]));
    let user = image_user(&rootfs, "edge");
    assert_ne!(user.split(':').next(), Some("0"), "not root");
    let (mode, uid, _) = mode_and_owner(&rootfs.join("var/lib/edge"));
    assert_eq!(
        (mode, uid.to_string()),
        (0o750, user.split(':').next().unwrap().to_owned())
    );
    let mut env = image_env(&config);
    let version = run(
        in_image(&rootfs, &user, "/", &env).args(["/usr/bin/edge", "--version"]),
        "edge --version in the image",
    );
    assert_eq!(
        version.trim(),
        format!("edge {}", env!("CARGO_PKG_VERSION"))
    );
    let checked = run(
        in_image(&rootfs, &user, "/", &env).args([
            "/usr/bin/edge",
            "check-config",
            "--config",
            "/etc/edge/edge.toml",
        ]),
        "edge check-config in the image",
    );
    assert!(
        checked.contains("node transport: 0.0.0.0:7100"),
        "{checked}"
    );
    assert!(checked.contains("nodes: 0"), "{checked}");

    // `serve` as the image's command, its ports moved to free loopback ones.
    let http_port = free_port();
    env.extend([
        ("EDGE__SERVER__LISTEN".to_owned(), "127.0.0.1:0".to_owned()),
        (
            "EDGE__HTTP__LISTEN".to_owned(),
            format!("127.0.0.1:{http_port}"),
        ),
        ("EDGE__ADMIN__LISTEN".to_owned(), "127.0.0.1:0".to_owned()),
    ]);
    let cmd: Vec<String> = config["Cmd"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let log = context.path().join("serve.log");
    let log_file = std::fs::File::create(&log).unwrap();
    let mut serving =
        tokio::process::Command::from(in_image(&rootfs, &user, "/var/lib/edge", &env));
    let mut serving = serving
        .arg("/usr/bin/edge")
        .args(&cmd)
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .kill_on_drop(true)
        .spawn()
        .expect("edge serve in the image");
    answers_200(
        "/healthz of the image's edge",
        &format!("http://127.0.0.1:{http_port}/healthz"),
    )
    .await;
    assert!(
        log_text(&log).contains("journal=/var/lib/edge/journal.sqlite3"),
        "the journal is in the volume: {}",
        log_text(&log)
    );
    let healthcheck: Vec<&str> = check[1..].iter().map(|v| v.as_str().unwrap()).collect();
    let healthy = support::output(
        in_image(&rootfs, &user, "/", &env).args(&healthcheck),
        "the image's health check",
    );
    assert!(
        healthy.status.success(),
        "{}",
        String::from_utf8_lossy(&healthy.stderr)
    );
    assert!(terminate(&mut serving, "the image's edge").await.success());
    let unhealthy = support::output(
        in_image(&rootfs, &user, "/", &env).args(&healthcheck),
        "the image's health check",
    );
    assert_eq!(
        unhealthy.status.code(),
        Some(1),
        "a stopped edge is unhealthy"
    );
    buildah.run(&["umount", &container]);
    buildah.run(&["rm", &container]);

    // The node image's binary.
    let container = buildah.run(&["from", "--quiet", "localhost/edge-node:test"]);
    let rootfs = PathBuf::from(buildah.run(&["mount", &container]));
    let user = image_user(&rootfs, "edge-node");
    let version = run(
        in_image(&rootfs, &user, "/", &image_env(&node_config))
            .args(["/usr/bin/edge-node", "--version"]),
        "edge-node --version in the image",
    );
    assert_eq!(
        version.trim(),
        format!("edge-node {}", env!("CARGO_PKG_VERSION"))
    );
    buildah.run(&["umount", &container]);
    buildah.run(&["rm", &container]);
}

/// The text of the `edge.toml` key of the Secret in `deploy/kubernetes/edge.yaml`.
fn site_config() -> String {
    let manifest = std::fs::read_to_string(repo().join("deploy/kubernetes/edge.yaml"))
        .expect("deploy/kubernetes/edge.yaml");
    let start = manifest
        .find("  edge.toml: |\n")
        .expect("the Secret's edge.toml")
        + 15;
    manifest[start..]
        .lines()
        .take_while(|line| line.is_empty() || line.starts_with("    "))
        .map(|line| line.strip_prefix("    ").unwrap_or(line))
        .collect::<Vec<_>>()
        .join("\n")
}

#[crate::common::test(deadline_secs = 300)]
async fn the_kubernetes_manifests_are_valid_and_a_node_pod_registers_as_its_machine() {
    let validate = support::tool("kubernetes-validate.sh", &[]);
    let manifests: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy/kubernetes"))
        .expect("deploy/kubernetes")
        .map(|entry| entry.expect("an entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    assert!(manifests.len() >= 4, "{manifests:?}");
    // The oldest Kubernetes the manifests claim, and the newest the validator knows.
    for version in ["1.30.0", "1.37.0"] {
        run(
            Command::new(&validate)
                .args(["--strict", "--quiet", "-k", version])
                .args(&manifests),
            &format!("kubernetes-validate against {version}"),
        );
    }

    // The site's config: refused on its listener until the example tokens are replaced.
    let dir = tempfile::tempdir().expect("a directory");
    let config = dir.path().join("edge.toml");
    std::fs::write(&config, site_config()).unwrap();
    // Each member's own addresses come from its pod's environment (edge.yaml).
    let member = [
        (
            "EDGE__CLUSTER__ADVERTISE_NODES",
            "edge-0.edge-members.edge.svc.cluster.local:7100",
        ),
        (
            "EDGE__CLUSTER__ADVERTISE_API",
            "edge-0.edge-members.edge.svc.cluster.local:8080",
        ),
    ];
    let manifest = std::fs::read_to_string(repo().join("deploy/kubernetes/edge.yaml")).unwrap();
    for (key, _) in member {
        assert!(
            manifest.contains(&format!("name: {key}")),
            "edge.yaml sets {key}"
        );
    }
    let refused = support::output(
        Command::new(support::edge_binary())
            .args(["check-config", "--config"])
            .arg(&config)
            .envs(member),
        "edge check-config on the site's config",
    );
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "example tokens refused");
    for named in [
        r#"nodes[0] (id "gpu-box-1")"#,
        r#"nodes[1] (id "gpu-box-2")"#,
        "`token`",
    ] {
        assert!(said.contains(named), "{named}: {said}");
    }
    let tokens = std::fs::read_to_string(repo().join("deploy/kubernetes/edge-node.yaml")).unwrap();
    let mut replaced = site_config();
    for machine in ["gpu-box-1", "gpu-box-2"] {
        let example = format!("example-token-{machine}-CHANGE-ME");
        assert!(
            tokens.contains(&format!("  {machine}: {example}")),
            "the tokens' Secret has a key for {machine}"
        );
        let generated = run(
            Command::new(support::edge_binary()).args(["token", "generate"]),
            "edge token generate",
        );
        let (_, digest) = generated_token(&generated);
        replaced = replaced.replace(
            &format!("token = \"{example}\""),
            &format!("token_sha256 = \"{digest}\""),
        );
    }
    std::fs::write(&config, replaced).unwrap();
    let summary = run(
        Command::new(support::edge_binary())
            .args(["check-config", "--config"])
            .arg(&config)
            .envs(member),
        "edge check-config on the site's config with real tokens",
    );
    assert!(summary.contains("nodes: 2"), "{summary}");
    assert!(summary.contains("cluster: site edge"), "{summary}");

    // A node started with the DaemonSet's variables (its id the machine's name, its token
    // the Secret's key of that name, mounted as a file) registers as that machine.
    let daemonset =
        std::fs::read_to_string(repo().join("deploy/kubernetes/edge-node.yaml")).unwrap();
    for wired in [
        "fieldPath: spec.nodeName",
        "/etc/edge-node/tokens/$(EDGE_NODE_ID)",
    ] {
        assert!(daemonset.contains(wired), "{wired}");
    }
    let machine_token = "token-of-gpu-box-2";
    let machines = format!(
        "{}{}",
        common::NodeTable::new("gpu-box-1", "gpu-box-1", "token-of-gpu-box-1").echo(&["default"]),
        common::NodeTable::new("gpu-box-2", "gpu-box-2", machine_token).echo(&["default"])
    );
    let app = common::spawn_app(&machines).await;
    let tokens_dir = dir.path().join("tokens");
    std::fs::create_dir(&tokens_dir).unwrap();
    std::fs::write(tokens_dir.join("gpu-box-2"), format!("{machine_token}\n")).unwrap();
    let mut node = tokio::process::Command::new(support::node_binary())
        .env_clear()
        .env("EDGE_NODE_ID", "gpu-box-2")
        .env(
            "EDGE_NODE_TOKEN_FILE",
            tokens_dir.join("gpu-box-2").to_str().unwrap(),
        )
        .env("EDGE_NODE_EDGE", app.node_addr.to_string())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("edge-node");
    common::eventually("gpu-box-2 registers", || {
        app.parts.registry.get("gpu-box-2").is_some()
    })
    .await;
    assert!(app.parts.registry.get("gpu-box-1").is_none());
    assert!(terminate(&mut node, "edge-node").await.success());
    app.stop().await;
}

#[crate::common::test(deadline_secs = 300)]
async fn the_release_archive_unpacked_elsewhere_serves_on_its_own_config() {
    support::node_binary();
    let dist = tempfile::tempdir().expect("a dist directory");
    let printed = run(
        Command::new("bash")
            .arg(repo().join("packaging/release.sh"))
            .args(["--no-build", "--profile", support::profile(), "--out"])
            .arg(dist.path()),
        "packaging/release.sh",
    );
    let archive = PathBuf::from(printed.lines().last().unwrap_or_default().trim());
    let name = format!(
        "edge-{}-x86_64-unknown-linux-gnu.tar.gz",
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(archive, dist.path().join(&name), "{printed}");
    eprintln!(
        "packaging: {name}: {} KiB",
        std::fs::metadata(&archive).unwrap().len() / 1024
    );
    let checked = run(
        Command::new("sha256sum")
            .args(["--check", "SHA256SUMS"])
            .current_dir(dist.path()),
        "sha256sum --check SHA256SUMS",
    );
    assert!(checked.contains(&format!("{name}: OK")), "{checked}");

    let elsewhere = tempfile::tempdir().expect("a directory to unpack into");
    run(
        Command::new("tar")
            .arg("-xzf")
            .arg(&archive)
            .arg("-C")
            .arg(elsewhere.path()),
        "tar -xzf",
    );
    let unpacked = elsewhere.path().join(name.trim_end_matches(".tar.gz"));
    for file in [
        "edge",
        "edge-node",
        "config/edge.toml",
        "node.env",
        "systemd/edge.service",
        "systemd/edge-node.service",
        "LICENSE-MIT",
        "LICENSE-APACHE",
        "README.md",
        "INSTALL.md",
    ] {
        assert!(unpacked.join(file).is_file(), "the archive holds {file}");
    }
    // `./edge serve` in the unpacked folder reads its own config/edge.toml; only the
    // ports move, to free ones, and the journal to a home of the test's.
    let mut serving = tokio::process::Command::new(unpacked.join("edge"))
        .current_dir(&unpacked)
        .env_clear()
        .env("HOME", elsewhere.path())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
        ])
        .args(["--admin-listen", "127.0.0.1:0", "--log-format", "json"])
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("the archive's edge");
    let (logs, bound) = watch_stderr(serving.stderr.take().expect("its stderr"));
    let (_, http) = bounded("the archive's edge to serve", bound)
        .await
        .expect("it logged its addresses");
    answers_200(
        "/healthz of the archive's edge",
        &format!("http://{http}/healthz"),
    )
    .await;
    let lines = common::logged(&logs).join("\n");
    assert!(
        lines.contains("config/edge.toml"),
        "its own config: {lines}"
    );
    assert!(lines.contains("\"nodes\":0"), "no node defined: {lines}");
    assert!(
        terminate(&mut serving, "the archive's edge")
            .await
            .success()
    );
}

#[crate::common::test]
fn every_crate_is_licensed_mit_or_apache_and_the_packaged_config_is_the_default_with_no_node() {
    for manifest in [
        "Cargo.toml",
        "node/Cargo.toml",
        "mock_node/Cargo.toml",
        "loadgen/Cargo.toml",
        "thread_slice/Cargo.toml",
        "test_deadline/Cargo.toml",
        "fuzz/Cargo.toml",
    ] {
        let text = std::fs::read_to_string(repo().join(manifest)).expect(manifest);
        assert!(
            text.contains("\nlicense = \"MIT OR Apache-2.0\"\n"),
            "{manifest} is licensed MIT OR Apache-2.0"
        );
    }
    let mit = std::fs::read_to_string(repo().join("LICENSE-MIT")).expect("LICENSE-MIT");
    assert!(mit.starts_with("MIT License"));
    let apache = std::fs::read_to_string(repo().join("LICENSE-APACHE")).expect("LICENSE-APACHE");
    assert!(apache.contains("Apache License") && apache.contains("Version 2.0, January 2004"));

    // packaging/edge.toml is config/edge.toml between its header and its nodes.
    let default = std::fs::read_to_string(repo().join("config/edge.toml")).unwrap();
    let packaged = std::fs::read_to_string(repo().join("packaging/edge.toml")).unwrap();
    let settings = |text: &str| -> String {
        let from = text
            .find("\n# Every section")
            .expect("the header's common part");
        let to = text.find("\n# ------").expect("the nodes' part");
        text[from..to].to_owned()
    };
    assert_eq!(
        settings(&packaged),
        settings(&default),
        "packaging/edge.toml's settings differ from config/edge.toml's: copy them over"
    );
    assert!(
        !packaged.lines().any(|line| line.starts_with("[[nodes")),
        "the packaged config defines no node"
    );
    let summary = run(
        Command::new(support::edge_binary())
            .args(["check-config", "--config"])
            .arg(repo().join("packaging/edge.toml")),
        "edge check-config packaging/edge.toml",
    );
    assert!(summary.contains("nodes: 0"), "{summary}");

    // The units say what the issue asks of them.
    let edge = Unit::read(&repo().join("packaging/systemd/edge.service"));
    for (key, value) in [
        ("Type", "notify"),
        (
            "ExecStart",
            "/usr/bin/edge serve --config /etc/edge/edge.toml",
        ),
        ("StateDirectory", "edge"),
        ("User", "edge"),
        ("Restart", "on-failure"),
        ("NoNewPrivileges", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("PrivateTmp", "yes"),
        ("CapabilityBoundingSet", ""),
    ] {
        assert_eq!(edge.get(key), Some(value), "edge.service {key}");
    }
    let node = Unit::read(&repo().join("packaging/systemd/edge-node.service"));
    assert_eq!(node.get("EnvironmentFile"), Some("/etc/edge/node.env"));
    assert!(node.get("RestartSec").is_some() && node.get("Restart").is_some());
    assert!(
        node.all("ExecStart")
            .iter()
            .all(|exec| !exec.contains("TOKEN")),
        "the token is never in the unit"
    );
}

#[crate::common::test]
async fn the_edge_tells_systemd_when_it_is_ready_and_stopping_and_checks_its_own_health() {
    // The shipped demo config, on loopback (its example tokens are fine there).
    let notify = NotifySocket::new("serve");
    let data = tempfile::tempdir().expect("a data directory");
    let http_port = free_port();
    let mut serving = tokio::process::Command::new(support::edge_binary())
        .args(["serve", "--config"])
        .arg(repo().join("config/edge.toml"))
        .args(["--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .args(["--http-listen", &format!("127.0.0.1:{http_port}")])
        .arg("--data-dir")
        .arg(data.path())
        .env("NOTIFY_SOCKET", &notify.name)
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("edge serve");
    assert_eq!(notify.next("ready").await, "READY=1");
    // Ready means bound: /healthz answers at once.
    let url = format!("http://127.0.0.1:{http_port}/healthz");
    assert_eq!(
        http_client()
            .get(&url)
            .send()
            .await
            .expect("/healthz")
            .status(),
        200
    );
    let healthcheck = |args: &[&str]| {
        support::output(
            Command::new(support::edge_binary())
                .arg("healthcheck")
                .args(args),
            "edge healthcheck",
        )
    };
    let healthy = healthcheck(&["--url", &url]);
    assert!(
        healthy.status.success(),
        "{}",
        String::from_utf8_lossy(&healthy.stderr)
    );
    assert!(String::from_utf8_lossy(&healthy.stdout).contains("healthy"));
    let bare = healthcheck(&["--url", &format!("http://127.0.0.1:{http_port}")]);
    assert!(bare.status.success(), "a bare address asks /healthz");
    assert!(terminate(&mut serving, "edge").await.success());
    assert_eq!(notify.next("stopping").await, "STOPPING=1");
    let down = healthcheck(&["--url", &url]);
    assert_eq!(down.status.code(), Some(1));
    let said = String::from_utf8_lossy(&down.stderr);
    assert!(said.contains(&url), "names what it asked: {said}");

    // The same demo config listening on every address: its example tokens are refused.
    let refused = support::output(
        Command::new(support::edge_binary())
            .args(["serve", "--config"])
            .arg(repo().join("config/edge.toml"))
            .args(["--listen", "0.0.0.0:0"]),
        "edge serve off loopback",
    );
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    for named in [
        "config/edge.toml",
        r#"nodes[0] (id "node-a")"#,
        r#"nodes[1] (id "node-b")"#,
        "`token`",
        "CHANGE-ME",
    ] {
        assert!(said.contains(named), "{named}: {said}");
    }
    assert!(
        !said.contains("example-token-node-a"),
        "no token shown: {said}"
    );
}
