//! A panic while answering one request is a bug; it must cost that request only. The
//! request's future runs under `futures_util::FutureExt::catch_unwind`; this names the panic
//! for the log line and the error.

/// The message a panic was raised with (`panic!("...")`), or `panic` when it carried none.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_owned())
}
