//! The `edge` binary; everything lives in the library (`edge::cli`).

/// mimalloc: a request's allocations are freed on the thread that made them (decision 26).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    edge::cli::main()
}
