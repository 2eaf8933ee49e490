//! Comparing and making secrets (tokens, the worker secret).

/// Equality whose time depends only on the lengths, not on where the bytes differ.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// 256 random bits as hex: secrets and generated tokens.
pub fn random_token() -> String {
    let a: u128 = rand::random();
    let b: u128 = rand::random();
    format!("{a:032x}{b:032x}")
}
