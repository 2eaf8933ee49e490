//! Every body type (one per frame kind, and the nested ones) on arbitrary payloads.
//! Input layout: `[selector, payload…]` (`osprey_fuzz::BODY_TARGETS`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Some((&selector, payload)) = data.split_first() {
        osprey_fuzz::check_body_selector(selector, payload);
    }
});
