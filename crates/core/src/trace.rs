//! One trace per task: the X-Ray trace header of the message being handled travels on with every
//! message its handling sends and every call its agent makes.
//!
//! Lambda hands each SQS record's `AWSTraceHeader` (the header its sender's request carried) to
//! the function; [`crate::role::handle`] runs the record's handling inside [`scope`] with it, and
//! [`crate::bus::Outgoing::new`] captures [`current`] when a message is made, so a message sent
//! later (a buffered batch) still carries the header of the record that caused it. The SQS bus
//! sends it as the message's `AWSTraceHeader` system attribute (not counted against the message's
//! size), the HTTP agent as `X-Amzn-Trace-Id`. A message with no header starts none: Lambda's
//! active tracing then traces the invocation on its own.

use std::future::Future;

tokio::task_local! {
    static HEADER: Option<String>;
}

/// The longest header passed on (X-Ray's are about 100 bytes; anything longer is not one).
pub const MAX_HEADER_BYTES: usize = 256;

/// The trace header of the record being handled, if any.
pub fn current() -> Option<String> {
    HEADER.try_with(Clone::clone).ok().flatten()
}

/// Run `fut` as the handling of a record whose trace header is `header`. A header that is not
/// printable ASCII of at most [`MAX_HEADER_BYTES`] (it came from outside) is dropped.
pub async fn scope<F: Future>(header: Option<String>, fut: F) -> F::Output {
    let header = header.filter(|h| is_plausible(h));
    HEADER.scope(header, fut).await
}

/// Whether `h` may be passed on as a header: `Root=1-...` style, printable ASCII, short.
pub fn is_plausible(h: &str) -> bool {
    !h.is_empty() && h.len() <= MAX_HEADER_BYTES && h.bytes().all(|b| b.is_ascii_graphic()) && h.contains("Root=")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_scope_passes_its_header_and_drops_what_is_not_one() {
        assert_eq!(current(), None);
        let h = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1";
        assert_eq!(scope(Some(h.into()), async { current() }).await.as_deref(), Some(h));
        for bad in ["", "Root=1-\n-x", "no root here", &format!("Root={}", "a".repeat(300))] {
            assert_eq!(scope(Some(bad.into()), async { current() }).await, None, "{bad:?}");
        }
        assert_eq!(current(), None, "nothing leaks out of a scope");
    }
}
