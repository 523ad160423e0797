//! cargo-fuzz target: request decoding must never panic.
#![no_main]
use fuse_core::abi::{
    decode_request, init, security_context, supplementary_groups, DecodeOptions,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    // The first byte picks the negotiated protocol, the rest is the message.
    let Some((&sel, msg)) = data.split_first() else { return };
    let opts = DecodeOptions {
        minor: [8, 12, 16, 45][usize::from(sel & 3)],
        flags: if sel & 4 != 0 { init::SETXATTR_EXT } else { 0 },
        write_data_elsewhere: sel & 8 != 0,
    };
    if let Ok(req) = decode_request(msg, opts) {
        let _ = security_context(req.ext);
        let _ = supplementary_groups(req.ext);
    }
});
