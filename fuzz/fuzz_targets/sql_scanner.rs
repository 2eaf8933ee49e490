//! The SQL text scanner (`osprey-sql`): `code_text`, `controls_session`,
//! `touches_session_state`, `placeholders`, `is_plain_select`, `digest` and their invariants.
//! Input: SQL text (bytes that are not UTF-8 are replaced, as no SQL reaches the
//! scanner without passing the UTF-8 check).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    osprey_fuzz::check_sql(&String::from_utf8_lossy(data));
});
