//! Register command streams ("regcmd"): the 64-bit entries the RK3588 NPU's PC block
//! fetches, and a readable listing of any stream.
//!
//! Entry layout (little-endian u64): bits 63–48 target (block id | 1), 47–16 value,
//! 15–0 register offset. Owns the entry format and the names; what the values mean for a
//! convolution is [`super::conv`]'s.

use super::names::REGISTERS;
use std::fmt::Write as _;

/// Block id (the `target` without its low bit) for a register offset, from its block base.
pub fn block_of(reg: u16) -> Option<u16> {
    Some(match reg >> 12 {
        0x0 => 0x0100, // PC
        0x1 => 0x0200, // CNA
        0x3 => 0x0800, // CORE
        0x4 => 0x1000, // DPU
        0x5 => 0x2000, // DPU_RDMA
        0x6 => 0x4000, // PPU
        0x7 => 0x8000, // PPU_RDMA
        _ => return None,
    })
}

/// One entry for register `reg` of its own block.
pub fn entry(reg: u16, value: u32) -> u64 {
    let target = block_of(reg).map_or(0, |b| b | 1);
    raw(target, reg, value)
}

/// One entry with an explicit target.
pub fn raw(target: u16, reg: u16, value: u32) -> u64 {
    (u64::from(target) << 48) | (u64::from(value) << 16) | u64::from(reg)
}

/// `(target, register, value)` of an entry.
pub fn split(e: u64) -> (u16, u16, u32) {
    ((e >> 48) as u16, e as u16, (e >> 16) as u32)
}

/// The entry required before the operation enable (per the TRM).
pub const PRE_ENABLE: u64 = 0x0041_0000_0000_0000;
/// `PC_OPERATION_ENABLE` broadcast to all blocks (target 0x0081), value 0x1d.
pub const ENABLE: u64 = 0x0081_0000_001d_0008;
/// `PC_BASE_ADDRESS`: the next task's stream.
pub const PC_BASE_ADDRESS: u16 = 0x0010;
/// `PC_REGISTER_AMOUNTS`: how much of the next task's stream to fetch.
pub const PC_REGISTER_AMOUNTS: u16 = 0x0014;

/// Registers whose value is an NPU (DMA) address.
pub const ADDRESS_REGS: [u16; 10] = [0x0010, 0x1070, 0x1110, 0x4020, 0x5018, 0x5020, 0x502C, 0x5038, 0x6070, 0x701C];

/// `BLOCK_NAME` of a register, if known.
pub fn name(reg: u16) -> Option<String> {
    let i = REGISTERS.binary_search_by_key(&reg, |r| r.0).ok()?;
    let (_, block, name) = REGISTERS[i];
    Some(format!("{block}_{name}"))
}

/// Reads a stream file's bytes as entries; the length must be a multiple of 8.
pub fn from_bytes(b: &[u8]) -> Result<Vec<u64>, String> {
    if b.len() % 8 != 0 {
        return Err(format!("{} bytes is not a whole number of 8-byte regcmd entries", b.len()));
    }
    Ok(b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8]))).collect())
}

/// The stream as little-endian bytes.
pub fn to_bytes(e: &[u64]) -> Vec<u8> {
    e.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A readable listing: index, raw entry, target, register, name, value.
pub fn listing(e: &[u64]) -> String {
    let mut s = String::from(" idx  raw                 target  reg     name                                value\n");
    for (i, &v) in e.iter().enumerate() {
        let (t, r, val) = split(v);
        let n = if v == 0 {
            "(zero entry: no next task)".to_string()
        } else if v == PRE_ENABLE {
            "(0x0041 entry: required before op_en)".to_string()
        } else if t == 0x0081 && r == 0x0008 {
            "PC_OPERATION_ENABLE (all blocks)".to_string()
        } else {
            let n = name(r).unwrap_or_else(|| format!("(unnamed 0x{r:04x})"));
            if block_of(r).map(|b| b | 1) != Some(t) {
                format!("{n} [target 0x{t:04x} is not this register's block]")
            } else {
                n
            }
        };
        let addr = if ADDRESS_REGS.contains(&r) && v != 0 && val != 0 { "  (address)" } else { "" };
        let _ = writeln!(s, "{i:4}  0x{v:016x}  {t:04x}    0x{r:04x}  {n:<36}0x{val:08x}{addr}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_layout() {
        assert_eq!(entry(0x1040, 0xb1), 0x0201_0000_00b1_1040);
        assert_eq!(entry(0x0014, 0), 0x0101_0000_0000_0014);
        assert_eq!(split(0x1001_ffff_ff80_4080), (0x1001, 0x4080, 0xffff_ff80));
        assert_eq!(name(0x5020).as_deref(), Some("DPU_RDMA_RDMA_BS_BASE_ADDR"));
        assert!(from_bytes(&[0; 7]).is_err());
    }
}
