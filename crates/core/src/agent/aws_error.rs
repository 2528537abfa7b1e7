//! What an agent that calls an AWS API (the approval, SQS, SNS and EventBridge kinds) makes of a
//! failed call: worth another try ([`AgentError::Transient`]: throttling, server errors, timeouts,
//! connections that failed) or refused for good ([`AgentError::Permanent`]: the target does not
//! exist, the role may not call it, the request is wrong, its KMS key is unusable). One place for
//! every such kind, so they all tell the two apart the same way.

use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_runtime_api::http::Response;
use aws_smithy_types::error::display::DisplayErrorContext;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

use super::runtime::AgentError;

/// Error codes (the JSON and query protocols' spellings of SQS, SNS and EventBridge) with which a
/// service refuses a call for good: the same request can never succeed.
pub fn is_refusal_code(code: &str) -> bool {
    matches!(
        code,
        // the target does not exist
        "NotFound"
            | "NotFoundException"
            | "ResourceNotFoundException"
            | "QueueDoesNotExist"
            | "AWS.SimpleQueueService.NonExistentQueue"
            | "EndpointDisabled"
            // the caller may not
            | "AuthorizationError"
            | "AuthorizationErrorException"
            | "AccessDenied"
            | "AccessDeniedException"
            | "NotAuthorizedForSourceException"
            | "UnrecognizedClientException"
            | "InvalidClientTokenId"
            | "OptInRequired"
            // the request is wrong
            | "InvalidParameter"
            | "InvalidParameterException"
            | "InvalidParameterValue"
            | "InvalidParameterValueException"
            | "InvalidAddress"
            | "InvalidMessageContents"
            | "InvalidSecurity"
            | "MissingParameter"
            | "UnsupportedOperation"
            | "ValidationError"
            | "ValidationException"
            | "OperationDisabledException"
            // the queue's or topic's KMS key is unusable (SNS, SQS query and JSON spellings)
            | "KMSDisabled"
            | "KMSNotFound"
            | "KMSAccessDenied"
            | "KMSInvalidState"
            | "KMSOptInRequired"
            | "KmsAccessDenied"
            | "KmsDisabled"
            | "KmsInvalidKeyUsage"
            | "KmsInvalidState"
            | "KmsNotFound"
            | "KmsOptInRequired"
            | "KMS.AccessDeniedException"
            | "KMS.DisabledException"
            | "KMS.InvalidKeyUsageException"
            | "KMS.InvalidStateException"
            | "KMS.NotFoundException"
            | "KMS.OptInRequired"
    )
}

/// Error codes that say "not now": throttling (KMS's included), the service's own failures,
/// credentials that expired in flight, a conflicting change under way.
pub fn is_transient_code(code: &str) -> bool {
    matches!(
        code,
        "Throttling"
            | "ThrottlingException"
            | "ThrottledException"
            | "Throttled"
            | "RequestThrottled"
            | "RequestThrottledException"
            | "TooManyRequestsException"
            | "RequestLimitExceeded"
            | "LimitExceededException"
            | "SlowDown"
            | "KMSThrottling"
            | "KmsThrottled"
            | "KMS.ThrottlingException"
            | "InternalError"
            | "InternalErrorException"
            | "InternalFailure"
            | "InternalException"
            | "ServiceUnavailable"
            | "ServiceUnavailableException"
            | "RequestTimeout"
            | "RequestTimeoutException"
            | "ExpiredToken"
            | "ExpiredTokenException"
            | "RequestExpired"
            | "ConcurrentModificationException"
            // DynamoDB's: over the table's capacity, a transaction in the way
            | "ProvisionedThroughputExceededException"
            | "TransactionConflictException"
            | "TransactionInProgressException"
    )
}

/// What to do about an answer with this code and HTTP status: a known code decides; otherwise a
/// server error, 408 or 429 is worth another try and any other 4xx is the request's fault (the
/// same request would be refused again). Neither known: another try.
pub fn is_permanent(code: Option<&str>, status: Option<u16>) -> bool {
    if let Some(code) = code {
        if is_refusal_code(code) {
            return true;
        }
        if is_transient_code(code) {
            return false;
        }
    }
    matches!(status, Some(s) if (400..500).contains(&s) && s != 408 && s != 429)
}

/// A failed SDK call as the agent reports it: `what` (e.g. "sending to QUEUE") with the SDK's
/// whole error context. A request the SDK could not even build is permanent; a timeout, a failed
/// connection or an unreadable answer is transient; a service's answer is classified by
/// [`is_permanent`].
pub fn classify<E>(what: &str, e: &SdkError<E, Response>) -> AgentError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let message = format!("{what}: {}", DisplayErrorContext(e));
    let permanent = match e {
        SdkError::ConstructionFailure(_) => true,
        SdkError::ServiceError(ctx) => is_permanent(ctx.err().code(), Some(ctx.raw().status().as_u16())),
        // TimeoutError, DispatchFailure, ResponseError and whatever comes later
        _ => false,
    };
    if permanent {
        AgentError::Permanent { message }
    } else {
        AgentError::Transient { message, retry_after: None }
    }
}

#[cfg(test)]
mod tests {
    use aws_smithy_runtime_api::client::result::ConnectorError;
    use aws_smithy_types::body::SdkBody;
    use aws_smithy_types::error::ErrorMetadata;

    use super::*;

    fn service(code: &str, status: u16) -> SdkError<ErrorMetadata, Response> {
        let raw = Response::new(status.try_into().unwrap(), SdkBody::empty());
        SdkError::service_error(ErrorMetadata::builder().code(code).message("said the service").build(), raw)
    }

    fn is_perm(e: &AgentError) -> bool {
        matches!(e, AgentError::Permanent { .. })
    }

    #[test]
    fn refusals_are_permanent_and_throttling_server_errors_and_timeouts_are_not() {
        for (code, status) in [
            ("NotFound", 404),
            ("AWS.SimpleQueueService.NonExistentQueue", 400),
            ("QueueDoesNotExist", 400),
            ("ResourceNotFoundException", 400),
            ("AccessDeniedException", 400),
            ("AuthorizationError", 403),
            ("InvalidParameterValue", 400),
            ("ValidationException", 400),
            ("KMS.DisabledException", 400),
            ("KMSAccessDenied", 400),
            ("KmsNotFound", 400),
            ("SomethingNew", 400),
        ] {
            let e = classify("sending to q", &service(code, status));
            assert!(is_perm(&e), "{code} {status}: {e:?}");
            assert!(e.to_string().contains("sending to q") && e.to_string().contains("said the service"), "{e}");
        }
        for (code, status) in [
            ("ThrottlingException", 400),
            ("RequestThrottled", 403),
            ("KMSThrottling", 400),
            ("KMS.ThrottlingException", 400),
            ("InternalFailure", 500),
            ("ServiceUnavailable", 503),
            ("ExpiredToken", 400),
            ("SomethingNew", 500),
            ("SomethingNew", 429),
            ("SomethingNew", 408),
        ] {
            let e = classify("q", &service(code, status));
            assert!(!is_perm(&e), "{code} {status}: {e:?}");
        }
        let timeout: SdkError<ErrorMetadata, Response> = SdkError::timeout_error("slow");
        assert!(!is_perm(&classify("q", &timeout)));
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let dispatch: SdkError<ErrorMetadata, Response> =
            SdkError::dispatch_failure(ConnectorError::io(refused.into()));
        assert!(!is_perm(&classify("q", &dispatch)));
        let unbuilt: SdkError<ErrorMetadata, Response> = SdkError::construction_failure("no queue url");
        assert!(is_perm(&classify("q", &unbuilt)));
    }

    #[test]
    fn without_a_status_an_unknown_code_is_worth_another_try() {
        assert!(!is_permanent(Some("SomethingNew"), None));
        assert!(is_permanent(Some("AccessDenied"), None));
        assert!(!is_permanent(None, None));
    }
}
