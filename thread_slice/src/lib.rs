//! A thread's scheduling slice on Linux: how long the kernel lets it run before another
//! runnable thread may take the core, and so how soon a thread woken by I/O gets a busy
//! core.
//!
//! Since Linux 6.12 the fair scheduler (EEVDF) lets a thread ask for its own slice
//! (`sched_setattr`'s `sched_runtime` for `SCHED_OTHER` and `SCHED_BATCH`, 0.1–100 ms; the
//! default is 0.7 ms times 1 + log2 of the cores, 1.4 ms on two). A thread with a shorter
//! slice than the one running gets an earlier deadline, so when it wakes it takes the core
//! at once instead of waiting out the other's slice. Its share of the CPU is unchanged:
//! that is still its `nice` weight. A relay that wakes for a few microseconds per message,
//! beside an engine whose threads compute for milliseconds, is the case it is for.
//!
//! Older kernels accept the call and ignore the slice. Other systems have no such call:
//! [`request_slice`] says so and changes nothing.
//!
//! [`pin_to_cpu`] is the other scheduling call a program of the workspace needs: the load
//! generator's shared-core rig keeps its client on one core and the edge on the other
//! (`sched_setaffinity`). The edge and the node never pin their threads (decision 38).

use std::io;
use std::time::Duration;

/// The shortest slice the kernel grants; shorter requests are raised to it.
pub const MIN_SLICE: Duration = Duration::from_micros(100);
/// The longest slice the kernel grants; longer requests are cut to it.
pub const MAX_SLICE: Duration = Duration::from_millis(100);

/// A slice setting in µs as operators write it (`[edge] thread_slice_us`, the node's
/// `--thread-slice-us`): 0 asks for nothing (`None`: the kernel's default), else a slice
/// the kernel grants.
///
/// # Errors
/// What the setting must be, when it is neither.
pub fn configured_slice(us: u64) -> Result<Option<Duration>, String> {
    let slice = Duration::from_micros(us);
    if us == 0 {
        Ok(None)
    } else if (MIN_SLICE..=MAX_SLICE).contains(&slice) {
        Ok(Some(slice))
    } else {
        Err(format!(
            "it must be 0 (the kernel's default) or from {} to {} (the slices Linux grants)",
            MIN_SLICE.as_micros(),
            MAX_SLICE.as_micros()
        ))
    }
}

/// What [`request_slice`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The calling thread asked for the slice, keeping its policy and `nice`.
    Requested,
    /// The thread runs under a policy other than `SCHED_OTHER` or `SCHED_BATCH` (real
    /// time, deadline or idle), which someone chose on purpose: left as it is.
    OtherPolicy,
    /// This system has no per-thread slice.
    Unsupported,
}

/// Asks for `slice` (clamped to [`MIN_SLICE`]..=[`MAX_SLICE`]) for the calling thread.
/// Threads it starts afterwards inherit the slice.
///
/// # Errors
/// What the kernel answered when it refused.
pub fn request_slice(slice: Duration) -> io::Result<Outcome> {
    let slice = slice.clamp(MIN_SLICE, MAX_SLICE);
    #[cfg(target_os = "linux")]
    {
        linux::request_slice(slice)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = slice;
        Ok(Outcome::Unsupported)
    }
}

/// [`request_slice`], logging what the kernel said: for a program's main thread, before
/// it starts the threads that inherit the slice.
pub fn request_slice_logged(slice: Duration) {
    let slice_us = slice.as_micros();
    match request_slice(slice) {
        Ok(Outcome::Requested) => {
            tracing::info!(slice_us, "threads ask for their own scheduling slice");
        }
        Ok(Outcome::OtherPolicy) => tracing::info!(
            "the process runs under a scheduling policy chosen for it: its slice is left alone"
        ),
        Ok(Outcome::Unsupported) => {
            tracing::debug!("this system has no per-thread scheduling slice");
        }
        Err(error) => {
            tracing::warn!(%error, slice_us, "the kernel refused the threads' scheduling slice");
        }
    }
}

/// Restricts the calling thread to CPU `cpu` (its index as the kernel counts them, from
/// 0). Threads it starts afterwards inherit the restriction. Returns `false`, changing
/// nothing, on a system without per-thread affinity.
///
/// # Errors
/// What the kernel answered when it refused (a CPU this process may not use, or none such).
pub fn pin_to_cpu(cpu: usize) -> io::Result<bool> {
    #[cfg(target_os = "linux")]
    {
        linux::pin_to_cpu(cpu).map(|()| true)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        Ok(false)
    }
}

#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod linux {
    //! The two system calls, on the calling thread (`pid` 0).

    use std::io;
    use std::time::Duration;

    use super::Outcome;

    /// The kernel's `struct sched_attr`, its first version (48 bytes: what every kernel
    /// since 3.14 reads and writes).
    #[repr(C)]
    #[derive(Debug, Default)]
    struct SchedAttr {
        size: u32,
        sched_policy: u32,
        sched_flags: u64,
        sched_nice: i32,
        sched_priority: u32,
        sched_runtime: u64,
        sched_deadline: u64,
        sched_period: u64,
    }

    const ATTR_SIZE: u32 = std::mem::size_of::<SchedAttr>() as u32;

    pub(super) fn request_slice(slice: Duration) -> io::Result<Outcome> {
        let mut attr = SchedAttr::default();
        // SAFETY: `attr` is a live, writable `sched_attr` of `ATTR_SIZE` bytes, the size
        // passed; the kernel writes at most that many.
        let read =
            unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &raw mut attr, ATTR_SIZE, 0) };
        if read != 0 {
            return Err(io::Error::last_os_error());
        }
        let policy = i32::try_from(attr.sched_policy).unwrap_or(-1);
        if policy != libc::SCHED_OTHER && policy != libc::SCHED_BATCH {
            return Ok(Outcome::OtherPolicy);
        }
        // The same policy and nice (a `sched_attr` sets both), the new slice.
        attr.size = ATTR_SIZE;
        attr.sched_flags = 0;
        attr.sched_runtime = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: `attr` is a live, initialised `sched_attr` whose `size` field says its
        // size; the kernel only reads it.
        let written = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) };
        if written != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Outcome::Requested)
    }

    pub(super) fn pin_to_cpu(cpu: usize) -> io::Result<()> {
        // `CPU_SET` indexes past the set's end without a check.
        let bits = 8 * std::mem::size_of::<libc::cpu_set_t>();
        if cpu >= bits {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("CPU {cpu} is past the {bits} a CPU set holds"),
            ));
        }
        // SAFETY: `cpu_set_t` is a plain bit array; all zeros is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `cpu` is within the set, checked above.
        unsafe { libc::CPU_SET(cpu, &mut set) };
        let set_size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: `set` is a live, initialised `cpu_set_t` of the size passed; the kernel
        // only reads it.
        if unsafe { libc::sched_setaffinity(0, set_size, &raw const set) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A `/proc/thread-self/sched` field, when the kernel shows it (with `CONFIG_SCHED_DEBUG`).
    fn sched_field(name: &str) -> Option<u64> {
        let text = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
        text.lines()
            .find(|line| line.split_whitespace().next() == Some(name))
            .and_then(|line| line.rsplit(':').next())
            .and_then(|value| value.trim().parse().ok())
    }

    /// The calling thread's nice value, from `/proc/thread-self/stat` (field 19).
    fn nice() -> i64 {
        let stat = std::fs::read_to_string("/proc/thread-self/stat").expect("stat");
        let fields: Vec<&str> = stat.rsplit_once(") ").expect("comm").1.split(' ').collect();
        fields[16].parse().expect("nice")
    }

    /// Runs `test` on a thread of its own, so the test runner's threads keep their slice.
    fn on_a_thread_of_its_own(test: impl FnOnce() + Send + 'static) {
        std::thread::spawn(test).join().expect("the thread");
    }

    /// The calling thread's slice is `ns`, where the kernel shows it (not before 6.12, nor
    /// without `CONFIG_SCHED_DEBUG`).
    fn assert_slice(ns: u64) {
        if let Some(slice) = sched_field("se.slice") {
            assert_eq!(slice, ns);
        }
    }

    #[test]
    fn a_setting_is_0_or_a_slice_the_kernel_grants() {
        assert_eq!(configured_slice(0), Ok(None));
        assert_eq!(configured_slice(100), Ok(Some(MIN_SLICE)));
        assert_eq!(configured_slice(100_000), Ok(Some(MAX_SLICE)));
        for bad in [1, 99, 100_001] {
            let message = configured_slice(bad).unwrap_err();
            assert!(message.contains("from 100 to 100000"), "{message}");
        }
    }

    #[test]
    fn a_thread_gets_the_slice_it_asks_for_and_keeps_its_nice() {
        on_a_thread_of_its_own(|| {
            // A thread someone made nicer keeps that: the call sets the slice only.
            let niced = std::process::Command::new("renice")
                .args(["-n", "3", "-p"])
                .arg(thread_id().to_string())
                .status()
                .is_ok_and(|status| status.success());
            let before = nice();
            assert_eq!(
                request_slice(Duration::from_micros(250)).expect("request"),
                Outcome::Requested
            );
            assert_eq!(nice(), before);
            if niced {
                assert_eq!(before, 3);
            }
            assert_slice(250_000);
        });
    }

    #[test]
    fn requests_outside_the_kernels_range_are_clamped() {
        on_a_thread_of_its_own(|| {
            request_slice(Duration::from_nanos(1)).expect("request");
            assert_slice(100_000);
            request_slice(Duration::from_secs(5)).expect("request");
            assert_slice(100_000_000);
        });
    }

    #[test]
    fn threads_started_afterwards_inherit_the_slice() {
        on_a_thread_of_its_own(|| {
            request_slice(MIN_SLICE).expect("request");
            on_a_thread_of_its_own(|| assert_slice(100_000));
        });
    }

    /// The CPUs the calling thread may run on, as `/proc/thread-self/status` lists them.
    fn cpus_allowed() -> String {
        let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
        status
            .lines()
            .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list")
            .trim()
            .to_owned()
    }

    #[test]
    fn a_pinned_thread_runs_on_its_cpu_and_its_threads_inherit_it() {
        on_a_thread_of_its_own(|| {
            let first = cpus_allowed()
                .split([',', '-'])
                .next()
                .and_then(|cpu| cpu.parse::<usize>().ok())
                .expect("a CPU this thread may use");
            assert!(pin_to_cpu(first).expect("pin"));
            assert_eq!(cpus_allowed(), first.to_string());
            on_a_thread_of_its_own(move || assert_eq!(cpus_allowed(), first.to_string()));
        });
    }

    #[test]
    fn a_cpu_past_the_set_is_refused() {
        on_a_thread_of_its_own(|| {
            let before = cpus_allowed();
            assert!(pin_to_cpu(1 << 20).is_err());
            assert_eq!(cpus_allowed(), before);
        });
    }

    /// The calling thread's id, from `/proc/thread-self`.
    fn thread_id() -> u64 {
        let link = std::fs::read_link("/proc/thread-self").expect("thread-self");
        link.file_name()
            .and_then(|name| name.to_str())
            .and_then(|name| name.parse().ok())
            .expect("a thread id")
    }
}
