//! The `ingot` command-line program.

fn main() {
    std::process::exit(ingot_cli::main());
}
