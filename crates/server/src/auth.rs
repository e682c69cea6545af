//! Bearer tokens: the one check Flight and HTTP share.

use subtle::ConstantTimeEq;

/// Whether an `authorization` header value carries `Bearer {token}`. The
/// token is compared in constant time (its length is not secret), so the
/// time a wrong guess takes does not tell how much of it was right.
pub(crate) fn bearer_matches(header: Option<&str>, token: &str) -> bool {
    header
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|given| bool::from(given.as_bytes().ct_eq(token.as_bytes())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_exact_token_passes() {
        assert!(bearer_matches(Some("Bearer s3cret"), "s3cret"));
        for wrong in [
            None,
            Some("s3cret"),
            Some("Bearer s3cre"),
            Some("Bearer s3cret "),
            Some("Bearer S3cret"),
            Some("bearer s3cret"),
        ] {
            assert!(!bearer_matches(wrong, "s3cret"), "{wrong:?}");
        }
    }
}
