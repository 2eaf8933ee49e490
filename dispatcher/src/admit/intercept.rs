//! Stage 2: slow-SQL interception. A blocked statement is refused before anything is
//! reserved for it or routed; the digest is computed once and travels with the job to its
//! END, where the execution is accounted against it.

use osprey_protocol::Request;

use crate::admit::Refusal;
use crate::ctx::Ctx;

/// The digest of a single statement (checked), or `None` for a batch (each of its
/// statements is checked) or with interception off.
pub fn check(ctx: &Ctx, request: &Request) -> Result<Option<osprey_sql::Digest>, Refusal> {
    if !ctx.policy.intercept.enabled() {
        return Ok(None);
    }
    if request.batch.is_empty() {
        let d = ctx.policy.digest(&request.sql);
        ctx.policy.check(&d)?;
        return Ok(Some(d));
    }
    for st in &request.batch {
        ctx.policy.check(&ctx.policy.digest(&st.sql))?;
    }
    Ok(None)
}
