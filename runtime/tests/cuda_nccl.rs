//! NCCL on a GPU: found at run time, loaded by absolute path, a one-rank communicator made and
//! its device memory measured, and its mean over one rank is the identity, bit for bit. Without
//! a GPU the test prints why it skips; with `INGOT_REQUIRE_GPU=1` a missing GPU or a missing
//! NCCL fails it.

use cudarc::driver::{CudaContext, DevicePtrMut};
use ingot_runtime::cuda::{self, nccl, require};

#[test]
fn a_one_rank_nccl_sum_is_the_identity_and_its_memory_is_measured() {
    if !cuda::gpu_for_test("a_one_rank_nccl_mean_is_the_identity_and_its_memory_is_measured") {
        return;
    }
    let lib = match nccl::load() {
        Ok(l) => l,
        Err(e) if require::gpu_required() => panic!("INGOT_REQUIRE_GPU is set but {e}"),
        Err(e) => {
            eprintln!("skipping: {e}");
            return;
        }
    };
    let ctx = CudaContext::new(0).unwrap();
    let stream = ctx.default_stream();
    ctx.bind_to_thread().unwrap();
    let free = || cudarc::driver::result::mem_get_info().unwrap().0 as i64;
    let before = free();
    let mut comms = lib.init_all(&[0]).unwrap();
    let took = before - free();
    eprintln!(
        "NCCL {} at {}: a one-rank communicator took {took} bytes of device memory",
        lib.version().unwrap(),
        lib.path.display()
    );
    let host: Vec<f32> = (0..4099).map(|i| (i as f32 * 0.37).sin() * 1e3).collect();
    let mut dev = stream.clone_htod(&host).unwrap();
    {
        let (p, _sync) = dev.device_ptr_mut(&stream);
        // SAFETY: `dev` holds host.len() f32 on the communicator's device, alive past the sync.
        unsafe {
            comms[0]
                .all_reduce_sum(
                    p,
                    host.len(),
                    nccl::DataType::Float32,
                    stream.cu_stream() as *mut std::ffi::c_void,
                )
                .unwrap()
        };
    }
    stream.synchronize().unwrap();
    let back: Vec<f32> = stream.clone_dtoh(&dev).unwrap();
    assert!(
        back.iter()
            .zip(&host)
            .all(|(a, b)| a.to_bits() == b.to_bits()),
        "the sum over one rank changed the values"
    );
    drop(comms.pop());
}
