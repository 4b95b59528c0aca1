//! A model of what the NPU computes for one task of keel's int32-mode GEMM
//! ([`super::conv::Task::out32`]): read back from the task's registers (the decoder), it
//! reads the packed input and weights where the stream points and writes each output's
//! exact int32 sum where the stream says. Integer sums do not depend on order, so this is
//! what the MAC array gives whatever its tiling. The recording double ([`super::double`])
//! is the "hardware" of the tests with it; nothing here has been compared with a board.

use super::conv::Task;
use super::pack;

/// Runs task `t` over `input`, `weights` and `output`, each the bytes from the task's
/// address to the end of the buffer holding it. `Err`: the stream is not an int32-mode
/// GEMM task, or a buffer is too short for what it addresses.
pub fn run_task(t: &Task, input: &[u8], weights: &[u8], output: &mut [u8]) -> Result<(), String> {
    if !t.out32 || t.width != 1 {
        return Err("the model runs keel's int32-mode GEMM tasks (width 1, DPU_DATA_FORMAT int32) only".into());
    }
    let (k, n, rows, all) = (t.channels_real, t.out_channels_real, t.rows, t.all_rows);
    let surface = 16 * all as usize;
    for y in 0..rows as usize {
        for oc in 0..n {
            let mut acc = 0i32;
            for ic in 0..k {
                let x = *input.get((ic / 16) as usize * surface + 16 * y + (ic % 16) as usize).ok_or("the input buffer is shorter than the task reads")? as i8;
                let w = *weights.get(pack::weight_at(k, n, oc, ic)).ok_or("the weight buffer is shorter than the task reads")? as i8;
                acc = acc.wrapping_add(i32::from(x) * i32::from(w));
            }
            let at = (oc / 4) as usize * surface + 16 * y + 4 * (oc % 4) as usize;
            output.get_mut(at..at + 4).ok_or("the output buffer is shorter than the task writes")?.copy_from_slice(&acc.to_le_bytes());
        }
    }
    Ok(())
}
