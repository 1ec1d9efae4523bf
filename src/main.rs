//! The `edge` binary; everything lives in the library (`edge::app`).

/// mimalloc instead of the system allocator: the relay and the API allocate small,
/// short-lived buffers per event and per request (docs/benchmarks.md, decision 13).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    edge::app::cli::main()
}
