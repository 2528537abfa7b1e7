//! Callback: CallbackQueue and the function URL -> apply a callback step's answer.

#[tokio::main]
async fn main() -> Result<(), sas_functions::Error> {
    sas_functions::serve(sas_core::role::Role::Callback).await
}
