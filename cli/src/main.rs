//! The `ingot` command-line program.

/// The process counts its heap, so that a CPU run measures its memory beside the plan as a GPU
/// run does (`measured_bytes`, the report's memory chart): [`ingot_trainer::host_memory`].
#[global_allocator]
static HEAP: ingot_trainer::host_memory::Counting = ingot_trainer::host_memory::Counting;

fn main() {
    std::process::exit(ingot_cli::main());
}
