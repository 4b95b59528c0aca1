//! Golden bytes for every wire message: if an encoding changes, these fail and
//! the change must come with a protocol version bump (see `wire` module docs).

use keel_npu_hal::buffer::{BufferId, BufferRules};
use keel_npu_hal::caps::{Arch, Caps, DTypeSet, Identity, MemoryLimits, OpSet, UnitState, Units};
use keel_npu_hal::device::BatchStatus;
use keel_npu_hal::op::{Batch, BufferRef, DType, Layout, OpDesc, OpKind, TensorDesc};
use keel_npu_hal::wire::{self, BatchMsg, DeviceMsg, HostMsg, MAGIC, PROTOCOL_VERSION};
use keel_npu_hal::ErrorKind;

fn caps() -> Caps {
    Caps {
        units: Units { hvx_contexts: 4, hvx: UnitState::Verified, hmx: UnitState::Absent, npu_cores: 0, npu: UnitState::Absent },
        memory: MemoryLimits {
            va_budget: 3 << 30,
            scratch_bytes: 4 << 20,
            buffers: BufferRules { align: 4096, granule: 4096, max_size: 1 << 31 },
        },
        ops: OpSet::default().with(0).with(2),
        matmul_weights: DTypeSet::default().with(DType::Q4_0).with(DType::Q8_0),
        max_in_flight: 8,
        max_batch_ops: 32,
    }
}

fn batch() -> BatchMsg {
    let buffers = [BufferRef { id: BufferId(1), size: 4096 }, BufferRef { id: BufferId(2), size: 256 }];
    let tensors = [
        TensorDesc { dtype: DType::Q8_0, layout: Layout::Tiles32, ne: [64, 32, 1, 1], nb: [0; 4], buffer: 0, offset: 0 },
        TensorDesc::contiguous(DType::F32, [64, 1, 1, 1], 1, 0).unwrap(),
        TensorDesc::contiguous(DType::F32, [32, 1, 1, 1], 1, 128).unwrap(),
    ];
    let ops = [
        OpDesc { kind: OpKind::MatMul, src: [Some(0), Some(1), None], dst: 2 },
        OpDesc { kind: OpKind::RmsNorm { eps: 1e-5 }, src: [Some(2), None, None], dst: 2 },
    ];
    BatchMsg::new(7, &Batch { buffers: &buffers, tensors: &tensors, ops: &ops }).unwrap()
}

fn host_cases() -> Vec<(HostMsg, &'static str)> {
    vec![
        (HostMsg::Hello { magic: MAGIC, protocol_version: PROTOCOL_VERSION }, "00 cb 8a 95 e2 04 02"),
        (HostMsg::QueryCaps, "01"),
        (HostMsg::AllocBuffer { size: 1 << 20 }, "02 80 80 40"),
        (HostMsg::MapBuffer { id: BufferId(3), fd: -2, offset: 4096, len: 300 }, "03 03 03 80 20 ac 02"),
        (HostMsg::FreeBuffer { id: BufferId(3) }, "04 03"),
        (HostMsg::SelfTest { seed: 0x1234_5678 }, "06 f8 ac d1 91 01"),
        (
            HostMsg::SubmitBatch(batch()),
            "05 07 \
             02 01 80 20 02 80 02 \
             03 03 01 40 20 01 01 00 00 00 00 00 00 \
             00 00 40 01 01 01 04 80 02 80 02 80 02 01 00 \
             00 00 20 01 01 01 04 80 01 80 01 80 01 01 80 01 \
             02 00 01 00 01 01 00 02 \
             02 ac c5 27 37 01 02 00 00 02",
        ),
    ]
}

fn device_cases() -> Vec<(DeviceMsg, &'static str)> {
    let identity = Identity { arch: Arch::Hexagon { version: 73 }, firmware_version: 0x0001_0200, protocol_version: 1, emulated: true };
    vec![
        (DeviceMsg::HelloAck { identity }, "00 00 49 80 84 04 01 01"),
        (
            DeviceMsg::Caps(caps()),
            "01 04 02 00 00 00 80 80 80 80 0c 80 80 80 02 80 20 80 20 80 80 80 80 08 05 0c 08 20",
        ),
        (DeviceMsg::BufferAllocated { id: BufferId(9), size: 8192 }, "02 09 80 40"),
        (DeviceMsg::BufferMapped { id: BufferId(9), device_addr: 0xc000_0000 }, "03 09 80 80 80 80 0c"),
        (DeviceMsg::BufferFreed { id: BufferId(9) }, "04 09"),
        (DeviceMsg::BatchDone { seq: 300, status: BatchStatus::Done }, "05 ac 02 00"),
        (DeviceMsg::BatchDone { seq: 1, status: BatchStatus::Failed { op: 2, kind: ErrorKind::OutOfMemory } }, "05 01 01 02 02"),
        (DeviceMsg::SelfTestResult { seed: 5, digest: 0xffff_ffff }, "06 05 ff ff ff ff 0f"),
        (DeviceMsg::Error { kind: ErrorKind::Protocol, detail: 0x8000_0600 }, "07 04 80 8c 80 80 08"),
    ]
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" ")
}

fn norm(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn host_messages_match_golden_bytes() {
    for (msg, golden) in host_cases() {
        let mut buf = [0u8; wire::MAX_MESSAGE];
        let bytes = wire::encode(&msg, &mut buf).unwrap();
        assert_eq!(hex(bytes), norm(golden), "{msg:?}");
        assert_eq!(wire::decode::<HostMsg>(bytes).unwrap(), msg);
    }
}

#[test]
fn device_messages_match_golden_bytes() {
    for (msg, golden) in device_cases() {
        let mut buf = [0u8; wire::MAX_MESSAGE];
        let bytes = wire::encode(&msg, &mut buf).unwrap();
        assert_eq!(hex(bytes), norm(golden), "{msg:?}");
        assert_eq!(wire::decode::<DeviceMsg>(bytes).unwrap(), msg);
    }
}

/// Op descriptors of the kinds appended after protocol version 1 shipped
/// (GeGlu 11, Quantize 12, Copy 13; Scale 14 … GatedDeltaRule 19), and the optional
/// sources RmsNorm (weight) and Rope (cos/sin table) gained: an appended variant only
/// adds an index. `Attention` gained `window` (a varint after `scale`), which changes
/// an existing variant's encoding: protocol version 2.
fn op_cases() -> Vec<(OpDesc, &'static str)> {
    vec![
        (OpDesc { kind: OpKind::GeGlu, src: [Some(0), Some(1), None], dst: 2 }, "0b 01 00 01 01 00 02"),
        (OpDesc { kind: OpKind::Quantize, src: [Some(3), None, None], dst: 4 }, "0c 01 03 00 00 04"),
        (OpDesc { kind: OpKind::Copy, src: [Some(5), None, None], dst: 300 }, "0d 01 05 00 00 ac 02"),
        (OpDesc { kind: OpKind::RmsNorm { eps: 1e-6 }, src: [Some(0), Some(1), None], dst: 0 }, "02 bd 37 86 35 01 00 01 01 00 00"),
        (
            OpDesc { kind: OpKind::Rope { n_dims: 64, mode: 2, freq_base: 1e6 }, src: [Some(0), Some(1), Some(2)], dst: 0 },
            "03 40 02 00 24 74 49 01 00 01 01 01 02 00",
        ),
        (
            OpDesc { kind: OpKind::Attention { n_head: 8, n_head_kv: 2, scale: 0.125, window: 512 }, src: [Some(0), Some(1), Some(2)], dst: 0 },
            "04 08 02 00 00 00 3e 80 04 01 00 01 01 01 02 00",
        ),
        (OpDesc { kind: OpKind::Scale { s: 2.0 }, src: [Some(0), None, None], dst: 0 }, "0e 00 00 00 40 01 00 00 00 00"),
        (OpDesc { kind: OpKind::Sigmoid, src: [Some(0), None, None], dst: 1 }, "0f 01 00 00 00 01"),
        (OpDesc { kind: OpKind::Softplus, src: [Some(0), None, None], dst: 1 }, "10 01 00 00 00 01"),
        (OpDesc { kind: OpKind::L2Norm { eps: 1e-6 }, src: [Some(0), None, None], dst: 0 }, "11 bd 37 86 35 01 00 00 00 00"),
        (OpDesc { kind: OpKind::SsmConv, src: [Some(0), Some(1), Some(2)], dst: 3 }, "12 01 00 01 01 01 02 03"),
        (
            OpDesc { kind: OpKind::GatedDeltaRule { n_k_heads: 16, chunk: 64, scale: 0.0625 }, src: [Some(0), Some(1), Some(2)], dst: 3 },
            "13 10 40 00 00 80 3d 01 00 01 01 01 02 03",
        ),
    ]
}

#[test]
fn op_descriptors_match_golden_bytes() {
    for (op, golden) in op_cases() {
        let mut buf = [0u8; 64];
        let bytes = wire::encode(&op, &mut buf).unwrap();
        assert_eq!(hex(bytes), norm(golden), "{op:?}");
        assert_eq!(wire::decode::<OpDesc>(bytes).unwrap(), op);
    }
}

#[test]
fn decode_rejects_truncated_trailing_and_unknown() {
    let mut buf = [0u8; 64];
    let bytes = wire::encode(&HostMsg::MapBuffer { id: BufferId(3), fd: 4, offset: 0, len: 9 }, &mut buf).unwrap().to_vec();
    assert_eq!(wire::decode::<HostMsg>(&bytes[..bytes.len() - 1]), Err(ErrorKind::Protocol));
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(wire::decode::<HostMsg>(&longer), Err(ErrorKind::Protocol));
    assert_eq!(wire::decode::<HostMsg>(&[0x7f]), Err(ErrorKind::Protocol));
    assert_eq!(wire::decode::<DeviceMsg>(&[]), Err(ErrorKind::Protocol));
}

#[test]
fn full_batch_fits_max_message() {
    let t = TensorDesc { dtype: DType::F32, layout: Layout::RowMajor, ne: [u32::MAX; 4], nb: [u32::MAX; 4], buffer: u16::MAX, offset: u32::MAX };
    // The longest op descriptor: Attention (two u16, an f32 and a u32 window).
    let o = OpDesc { kind: OpKind::Attention { n_head: u16::MAX, n_head_kv: u16::MAX, scale: 1e4, window: u32::MAX }, src: [Some(u16::MAX); 3], dst: u16::MAX };
    let b = BufferRef { id: BufferId(u32::MAX), size: u64::MAX };
    let msg = HostMsg::SubmitBatch(
        BatchMsg::new(u32::MAX, &Batch { buffers: &[b; wire::MAX_BUFFERS], tensors: &[t; wire::MAX_TENSORS], ops: &[o; wire::MAX_OPS] })
            .unwrap(),
    );
    let mut buf = [0u8; wire::MAX_MESSAGE];
    let n = wire::encode(&msg, &mut buf).map(|b| b.len());
    eprintln!("worst-case full batch: {n:?} bytes");
    assert!(n.is_ok());
    let too_many = [o; wire::MAX_OPS + 1];
    assert_eq!(BatchMsg::new(0, &Batch { buffers: &[], tensors: &[], ops: &too_many }).unwrap_err(), ErrorKind::Unsupported);
}

#[test]
fn hello_checks_magic_and_version() {
    assert_eq!(wire::check_hello(MAGIC, PROTOCOL_VERSION), Ok(()));
    assert_eq!(wire::check_hello(MAGIC ^ 1, PROTOCOL_VERSION), Err(ErrorKind::Protocol));
    assert_eq!(wire::check_hello(MAGIC, PROTOCOL_VERSION + 1), Err(ErrorKind::Protocol));
}

/// `decode_host` as a `decode::<HostMsg>` result: the batch slot's contents by value.
fn in_place(bytes: &[u8], slot: &mut BatchMsg) -> Result<HostMsg, ErrorKind> {
    match wire::decode_host(bytes, slot)? {
        wire::Request::Batch(b) => Ok(HostMsg::SubmitBatch(b.clone())),
        wire::Request::Other(m) => Ok(m),
    }
}

/// A `SubmitBatch` (seq 7) whose table `table` (0 buffers, 1 tensors, 2 ops) has `n`
/// minimal entries and the others none, written by hand: the encoder refuses tables
/// longer than their capacity.
fn batch_with_table(table: usize, n: usize) -> Vec<u8> {
    let mut bytes = vec![0x05, 0x07];
    for k in 0..3 {
        let len = if k == table { n } else { 0 };
        let mut v = len;
        while v >= 0x80 {
            bytes.push((v as u8 & 0x7f) | 0x80);
            v >>= 7;
        }
        bytes.push(v as u8);
        for _ in 0..len {
            match k {
                0 => bytes.extend([0x01, 0x01]),   // BufferRef { id: 1, size: 1 }
                1 => bytes.extend([0x00; 12]),     // TensorDesc: F32, row-major, zeros
                _ => bytes.extend([0x00; 5]),      // OpDesc: MatMul, no sources, dst 0
            }
        }
    }
    bytes
}

/// The in-place decoder accepts and rejects exactly what `decode::<HostMsg>` does, with
/// the same value: every golden message, a full worst-case batch and an empty one, each
/// cut at every length and with a trailing byte, every byte of the golden batch set to
/// values that change varints, tags and lengths, and tables at and one past their
/// capacity. One slot serves every case, so a table left longer by an earlier batch
/// would show.
#[test]
fn decode_host_equals_decode() {
    let mut slot = BatchMsg::empty();
    let mut check = |bytes: &[u8]| {
        let want = wire::decode::<HostMsg>(bytes);
        assert_eq!(in_place(bytes, &mut slot), want, "{bytes:02x?}");
        want
    };
    let t = TensorDesc { dtype: DType::F32, layout: Layout::RowMajor, ne: [u32::MAX; 4], nb: [u32::MAX; 4], buffer: u16::MAX, offset: u32::MAX };
    let o = OpDesc { kind: OpKind::Attention { n_head: 9, n_head_kv: 3, scale: 0.5, window: 70_000 }, src: [Some(1), None, Some(u16::MAX)], dst: 2 };
    let b = BufferRef { id: BufferId(u32::MAX), size: u64::MAX };
    let full = BatchMsg::new(u32::MAX, &Batch { buffers: &[b; wire::MAX_BUFFERS], tensors: &[t; wire::MAX_TENSORS], ops: &[o; wire::MAX_OPS] }).unwrap();
    let mut msgs: Vec<HostMsg> = host_cases().into_iter().map(|(m, _)| m).collect();
    msgs.push(HostMsg::SubmitBatch(full));
    msgs.push(HostMsg::SubmitBatch(BatchMsg::empty()));
    let mut buf = vec![0u8; wire::MAX_MESSAGE];
    let mut accepted = 0;
    for msg in &msgs {
        let bytes = wire::encode(msg, &mut buf).unwrap().to_vec();
        assert_eq!(check(&bytes).as_ref(), Ok(msg));
        // A batch takes the in-place path (not merely the same answer through `Other`).
        let mut own = BatchMsg::empty();
        assert_eq!(matches!(wire::decode_host(&bytes, &mut own), Ok(wire::Request::Batch(_))), matches!(msg, HostMsg::SubmitBatch(_)), "{msg:?}");
        for n in 0..bytes.len() {
            accepted += check(&bytes[..n]).is_ok() as usize;
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(check(&longer).is_err());
    }
    // Byte by byte through the golden batch: some variants decode (to a different
    // message), most do not; both decoders must agree on each.
    let golden = wire::encode(&HostMsg::SubmitBatch(batch()), &mut buf).unwrap().to_vec();
    for i in 0..golden.len() {
        for v in [0x00, 0x01, 0x02, 0x05, 0x06, 0x7f, 0x80, 0xff] {
            let mut bytes = golden.clone();
            bytes[i] = v;
            accepted += check(&bytes).is_ok() as usize;
        }
    }
    assert!(accepted > 50, "only {accepted} altered messages decoded: the comparison saw too few successes");
    for (table, cap) in [(0, wire::MAX_BUFFERS), (1, wire::MAX_TENSORS), (2, wire::MAX_OPS)] {
        assert!(check(&batch_with_table(table, cap)).is_ok(), "table {table} at its capacity {cap} should decode");
        assert!(check(&batch_with_table(table, cap + 1)).is_err(), "table {table} one past its capacity {cap} decoded");
    }
}
