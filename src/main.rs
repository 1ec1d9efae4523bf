//! The `edge` binary; everything lives in the library (`edge::app`).

fn main() -> std::process::ExitCode {
    edge::app::cli::main()
}
