//! The frame layer (`FrameCodec`, as `FramedRead` drives it) on arbitrary bytes cut in
//! arbitrary chunks, then each decoded frame's body as its kind says.
//! Input layout: `osprey_fuzz::FRAME_PREFIX`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| osprey_fuzz::check_frame_input(data));
