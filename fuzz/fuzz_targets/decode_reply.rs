//! cargo-fuzz target: reply decoding (every opcode) must never panic.
#![no_main]
use fuse_core::abi::{decode_reply, Opcode};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, msg)) = data.split_first() else { return };
    let op = Opcode::ALL[usize::from(sel) % Opcode::ALL.len()];
    let _ = decode_reply(op, msg, u32::from(sel & 1));
    let _ = fuse_core::abi::decode_dirents(msg);
    let _ = fuse_core::abi::decode_direntplus(msg);
});
