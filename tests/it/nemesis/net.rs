//! The nemesis's network: one network namespace per process of the site (a veth pair into a
//! bridge of the root namespace, one address each on a /24 of its own), and partitions as
//! nftables drops written inside a namespace and removed to heal. The test process (clients,
//! balancer, engines' taps) stays in the root namespace and reaches every process through
//! the bridge.
//!
//! Where namespaces cannot be made (not root, no `ip`, no `nft`), every process runs in the
//! root namespace on a loopback address of its own and [`Net::partitions`] says why there are
//! none: the run says so and skips those faults. Nothing here decides what a test asserts.

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};

/// The namespaces' /24 is `10.231.<octet>.0/24`, the octet from the process id so two runs
/// at once do not meet; the bridge is `.1`.
const FIRST_OCTET: u8 = 10;
const SECOND_OCTET: u8 = 231;

/// Where the processes of the site live.
pub(crate) struct Net {
    /// The third octet of the /24 (namespaces), or of `127.66.<octet>.0` (loopback).
    octet: u8,
    /// The namespaces made, by process name; empty without namespaces.
    names: Vec<String>,
    /// Why there are no partitions (no namespaces); `None` when there are.
    unavailable: Option<String>,
}

/// Runs `program args`, its failure a message naming it.
fn run(program: &str, args: &[&str]) -> Result<(), String> {
    let output = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Runs `nft -f -` in namespace `ns` with `script` on its input.
fn nft(ns: &str, script: &str) -> Result<(), String> {
    use std::io::Write as _;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft in {ns}: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("no stdin")?
        .write_all(script.as_bytes())
        .map_err(|e| format!("nft's input: {e}"))?;
    let output = child
        .wait_with_output()
        .map_err(|e| format!("nft in {ns}: {e}"))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft in {ns}: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

impl Net {
    /// A namespace for each of `names`, or loopback addresses when namespaces cannot be made
    /// (the reason kept for [`Net::partitions`]).
    pub(crate) fn create(names: &[&str]) -> Self {
        let octet = u8::try_from(std::process::id() % 200 + 20).unwrap_or(66);
        let mut net = Self {
            octet,
            names: Vec::new(),
            unavailable: None,
        };
        if let Err(why) = net.namespaces(names) {
            net.remove();
            net.names.clear();
            net.unavailable = Some(why);
        }
        net
    }

    fn bridge(&self) -> String {
        format!("nemb{}", self.octet)
    }

    fn ns(&self, name: &str) -> String {
        format!("nem{}-{name}", self.octet)
    }

    fn subnet(&self) -> String {
        format!("{FIRST_OCTET}.{SECOND_OCTET}.{}.0/24", self.octet)
    }

    fn namespaces(&mut self, names: &[&str]) -> Result<(), String> {
        run("nft", &["--version"]).map_err(|e| format!("no nftables: {e}"))?;
        // What a crashed run of the same octet left.
        self.names = names.iter().map(|n| (*n).to_owned()).collect();
        self.remove();
        let routes = Command::new("ip")
            .args(["route", "show", &self.subnet()])
            .output()
            .map_err(|e| format!("cannot run ip: {e}"))?;
        if !routes.stdout.is_empty() {
            return Err(format!("{} is routed already", self.subnet()));
        }
        let bridge = self.bridge();
        let host = format!("{}/24", self.host());
        run("ip", &["link", "add", &bridge, "type", "bridge"])?;
        run("ip", &["addr", "add", &host, "dev", &bridge])?;
        run("ip", &["link", "set", &bridge, "up"])?;
        // Should the bridge's route go, the subnet's traffic is dropped here rather than
        // sent to the default route.
        let subnet = self.subnet();
        run(
            "ip",
            &["route", "add", "blackhole", &subnet, "metric", "4242"],
        )?;
        for (i, name) in names.iter().enumerate() {
            let ns = self.ns(name);
            let outside = format!("nemh{}x{i}", self.octet);
            let inside = format!("nemn{}x{i}", self.octet);
            let address = format!("{}/24", self.ip(name));
            run("ip", &["netns", "add", &ns])?;
            run(
                "ip",
                &[
                    "link", "add", &outside, "type", "veth", "peer", "name", &inside,
                ],
            )?;
            run("ip", &["link", "set", &inside, "netns", &ns])?;
            run("ip", &["link", "set", &outside, "master", &bridge, "up"])?;
            for args in [
                vec!["addr", "add", &address, "dev", &inside],
                vec!["link", "set", &inside, "up"],
                vec!["link", "set", "lo", "up"],
            ] {
                let mut all = vec!["netns", "exec", &ns, "ip"];
                all.extend(args);
                run("ip", &all)?;
            }
        }
        Ok(())
    }

    /// Why partitions cannot be made here; `None` when they can.
    pub(crate) fn partitions(&self) -> Option<&str> {
        self.unavailable.as_deref()
    }

    /// Where the test process is seen from the site's processes (the engines' taps listen
    /// there).
    pub(crate) fn host(&self) -> Ipv4Addr {
        if self.unavailable.is_some() {
            Ipv4Addr::new(127, 66, self.octet, 1)
        } else {
            Ipv4Addr::new(FIRST_OCTET, SECOND_OCTET, self.octet, 1)
        }
    }

    /// The address of process `name` (one of those given to [`Net::create`]).
    pub(crate) fn ip(&self, name: &str) -> Ipv4Addr {
        let index = self.index(name);
        let last = u8::try_from(index + 2).unwrap_or(254);
        if self.unavailable.is_some() {
            Ipv4Addr::new(127, 66, self.octet, last)
        } else {
            Ipv4Addr::new(FIRST_OCTET, SECOND_OCTET, self.octet, last)
        }
    }

    fn index(&self, name: &str) -> usize {
        self.names
            .iter()
            .position(|n| n == name)
            .or_else(|| PROCESSES.iter().position(|n| *n == name))
            .unwrap_or_else(|| panic!("no process {name}"))
    }

    /// `program` to run as process `name`: inside its namespace when there are any.
    pub(crate) fn command(&self, name: &str, program: &std::path::Path) -> tokio::process::Command {
        if self.unavailable.is_some() {
            return tokio::process::Command::new(program);
        }
        let mut command = tokio::process::Command::new("ip");
        command.args(["netns", "exec", &self.ns(name)]).arg(program);
        command
    }

    /// Cuts process `name` off from every one of `from` (both ways), replacing any cut it
    /// had.
    pub(crate) fn cut(&self, name: &str, from: &[&str]) -> Result<(), String> {
        if let Some(why) = &self.unavailable {
            return Err(why.clone());
        }
        let ips: Vec<String> = from.iter().map(|n| self.ip(n).to_string()).collect();
        let set = ips.join(", ");
        let script = format!(
            "table inet nemesis {{}}\ndelete table inet nemesis\ntable inet nemesis {{\n\
             chain input {{ type filter hook input priority 0; policy accept; ip saddr {{ {set} }} drop; }}\n\
             chain output {{ type filter hook output priority 0; policy accept; ip daddr {{ {set} }} drop; }}\n}}\n"
        );
        nft(&self.ns(name), &script)
    }

    /// Removes every cut of process `name`.
    pub(crate) fn heal(&self, name: &str) -> Result<(), String> {
        if self.unavailable.is_some() {
            return Ok(());
        }
        nft(
            &self.ns(name),
            "table inet nemesis {}\ndelete table inet nemesis\n",
        )
    }

    fn remove(&self) {
        for name in &self.names {
            let _ = run("ip", &["netns", "del", &self.ns(name)]);
        }
        let _ = run("ip", &["link", "del", &self.bridge()]);
        let _ = run(
            "ip",
            &[
                "route",
                "del",
                "blackhole",
                &self.subnet(),
                "metric",
                "4242",
            ],
        );
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        if self.unavailable.is_none() {
            self.remove();
        }
    }
}

/// Every process of the site, by name: NATS servers, members, nodes.
pub(crate) const PROCESSES: [&str; 9] = ["n1", "n2", "n3", "m1", "m2", "m3", "d1", "d2", "d3"];
