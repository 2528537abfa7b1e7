//! Structured logs with `tracing`: JSON inside Lambda (or with `SAS_LOG_FORMAT=json`), compact
//! text on a terminal. The filter comes from `RUST_LOG` (default `info`).

use tracing_subscriber::EnvFilter;

pub fn init() {
    init_with_default("info");
}

/// As [`init`], with another filter when `RUST_LOG` is not set (a tool whose own output says
/// what happened keeps the library's lines for errors: `"error"`).
pub fn init_with_default(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let json = std::env::var("AWS_LAMBDA_FUNCTION_NAME").is_ok()
        || std::env::var("SAS_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_target(false);
    let result = if json {
        // CloudWatch adds its own timestamp.
        builder.json().flatten_event(true).with_current_span(true).without_time().try_init()
    } else {
        // Colours only on a terminal: CI logs and files get plain text.
        let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
        builder.compact().with_ansi(ansi).with_writer(std::io::stderr).try_init()
    };
    // A second init (tests) keeps the first subscriber.
    drop(result);
}
