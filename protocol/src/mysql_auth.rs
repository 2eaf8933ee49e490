//! MySQL password hashes and scramble checks, shared by the dispatcher's MySQL front end
//! (which verifies clients) and the `osprey mysql-password` command (which prints the
//! hashes for the config file). No password is stored: only the double hashes MySQL
//! itself keeps, from which a scramble can be checked but the password not recovered.
//!
//! - `mysql_native_password`: the stored hash is `SHA1(SHA1(password))`, written as MySQL
//!   shows it (`*` and 40 upper-case hex digits). The client sends
//!   `SHA1(password) XOR SHA1(nonce + SHA1(SHA1(password)))`.
//! - `caching_sha2_password` (fast path): the stored hash is `SHA256(SHA256(password))` in
//!   64 hex digits. The client sends `SHA256(password) XOR SHA256(SHA256(SHA256(password)) + nonce)`.

use sha1::{Digest, Sha1};
use sha2::Sha256;

/// The `mysql_native_password` hash of `password` (`*` + 40 hex digits).
pub fn native_hash(password: &str) -> String {
    let once = Sha1::digest(password.as_bytes());
    format!("*{}", hex(&Sha1::digest(once)).to_ascii_uppercase())
}

/// The `caching_sha2_password` hash of `password` (64 hex digits).
pub fn sha2_hash(password: &str) -> String {
    let once = Sha256::digest(password.as_bytes());
    hex(&Sha256::digest(once))
}

/// Whether `hash` is a well-formed [`native_hash`].
pub fn is_native_hash(hash: &str) -> bool {
    hash.strip_prefix('*').and_then(unhex).is_some_and(|b| b.len() == 20)
}

/// Whether `hash` is a well-formed [`sha2_hash`].
pub fn is_sha2_hash(hash: &str) -> bool {
    unhex(hash).is_some_and(|b| b.len() == 32)
}

/// Checks a `mysql_native_password` answer to `nonce` (20 bytes) against `hash`.
pub fn verify_native(hash: &str, nonce: &[u8], answer: &[u8]) -> bool {
    let Some(stored) = hash.strip_prefix('*').and_then(unhex) else {
        return false;
    };
    if answer.len() != 20 || stored.len() != 20 {
        return false;
    }
    let mask = Sha1::new().chain_update(nonce).chain_update(&stored).finalize();
    let once: Vec<u8> = answer.iter().zip(mask.iter()).map(|(a, m)| a ^ m).collect();
    constant_eq(&Sha1::digest(&once), &stored)
}

/// Checks a `caching_sha2_password` fast-path answer to `nonce` (20 bytes) against `hash`.
pub fn verify_sha2(hash: &str, nonce: &[u8], answer: &[u8]) -> bool {
    let Some(stored) = unhex(hash) else {
        return false;
    };
    if answer.len() != 32 || stored.len() != 32 {
        return false;
    }
    let mask = Sha256::new().chain_update(&stored).chain_update(nonce).finalize();
    let once: Vec<u8> = answer.iter().zip(mask.iter()).map(|(a, m)| a ^ m).collect();
    constant_eq(&Sha256::digest(&once), &stored)
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's side of each plugin, as `mysql_common::scramble` computes it.
    fn native_answer(password: &str, nonce: &[u8]) -> Vec<u8> {
        let once = Sha1::digest(password.as_bytes());
        let twice = Sha1::digest(once);
        let mask = Sha1::new().chain_update(nonce).chain_update(twice).finalize();
        once.iter().zip(mask.iter()).map(|(a, m)| a ^ m).collect()
    }

    fn sha2_answer(password: &str, nonce: &[u8]) -> Vec<u8> {
        let once = Sha256::digest(password.as_bytes());
        let twice = Sha256::digest(once);
        let mask = Sha256::new().chain_update(twice).chain_update(nonce).finalize();
        once.iter().zip(mask.iter()).map(|(a, m)| a ^ m).collect()
    }

    #[test]
    fn mysql_shows_this_hash_for_password() {
        // SELECT PASSWORD('password') on MariaDB.
        assert_eq!(native_hash("password"), "*2470C0C06DEE42FD1618BB99005ADCA2EC9D1E19");
        assert!(is_native_hash(&native_hash("x")) && is_sha2_hash(&sha2_hash("x")));
    }

    #[test]
    fn answers_are_checked() {
        let nonce = b"0123456789abcdefghij";
        let (n, s) = (native_hash("s3cret"), sha2_hash("s3cret"));
        assert!(verify_native(&n, nonce, &native_answer("s3cret", nonce)));
        assert!(!verify_native(&n, nonce, &native_answer("s3creT", nonce)));
        assert!(!verify_native(
            &n,
            b"other nonce 12345678",
            &native_answer("s3cret", nonce)
        ));
        assert!(verify_sha2(&s, nonce, &sha2_answer("s3cret", nonce)));
        assert!(!verify_sha2(&s, nonce, &sha2_answer("nope", nonce)));
        assert!(!verify_native("garbage", nonce, &[0; 20]));
        assert!(!verify_sha2(&s, nonce, &[]));
    }
}
