//! The whole call's errors, with paused time: a client timeout bounds one attempt, an error
//! after retries says how many and what failed last, and a deadline's error says why.

use std::time::Duration;

use reqwest_middleware::ClientWithMiddleware;
use reqwest_throttle::{StopReason, Throttle, ThrottleError};
use tokio::net::TcpListener;

const S: Duration = Duration::from_secs(1);

/// A port where nothing listens.
fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// A server that accepts connections and never answers.
async fn silent_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/slow", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    url
}

fn client(throttle: &Throttle, timeout: Option<Duration>) -> ClientWithMiddleware {
    let mut http = reqwest::Client::builder().no_proxy();
    if let Some(t) = timeout {
        http = http.timeout(t);
    }
    reqwest_middleware::ClientBuilder::new(http.build().unwrap())
        .with(throttle.clone())
        .build()
}

fn throttle_error(err: &reqwest_middleware::Error) -> ThrottleError {
    ThrottleError::of(err)
        .cloned()
        .unwrap_or_else(|| panic!("expected a ThrottleError, got {err:?}"))
}

#[tokio::test(start_paused = true)]
async fn a_client_timeout_bounds_each_attempt_and_the_error_counts_them() {
    let url = silent_server().await;
    let throttle = Throttle::builder()
        .max_retries(2)
        .jitter(false)
        .build()
        .unwrap();
    let err = client(&throttle, Some(S / 2))
        .get(&url)
        .send()
        .await
        .unwrap_err();
    let e = throttle_error(&err);
    let ThrottleError::AttemptsFailed {
        attempts,
        waited,
        stopped,
        ..
    } = &e
    else {
        panic!("expected AttemptsFailed, got {e:?}");
    };
    // Three attempts of 500 ms each, 1 s and 2 s of backoff between them.
    assert_eq!((*attempts, *waited), (3, 3 * S));
    assert_eq!(*stopped, StopReason::RetriesExhausted);
    assert!(e.is_timeout() && !e.is_connect(), "{e}");
    assert!(e.to_string().contains("3 attempts failed"), "{e}");
    // The last failure is the source, and reqwest's error is reachable.
    let source = std::error::Error::source(&e).expect("a source");
    assert_eq!(source.to_string(), e.transport_error().unwrap().to_string());
}

#[tokio::test(start_paused = true)]
async fn one_failed_attempt_returns_reqwests_error_as_it_is() {
    let url = format!("http://127.0.0.1:{}/x", closed_port());
    let throttle = Throttle::builder().max_retries(0).build().unwrap();
    let err = client(&throttle, None).get(&url).send().await.unwrap_err();
    assert!(err.is_connect(), "{err:?}");
    assert_eq!(ThrottleError::of(&err), None);
}

#[tokio::test(start_paused = true)]
async fn a_deadline_over_transport_failures_is_a_deadline_error_with_the_cause() {
    let url = format!("http://127.0.0.1:{}/x", closed_port());
    let throttle = Throttle::builder()
        .deadline(2 * S)
        .jitter(false)
        .build()
        .unwrap();
    let err = client(&throttle, None).get(&url).send().await.unwrap_err();
    let e = throttle_error(&err);
    // Attempts at 0 s and 1 s; the next backoff (2 s) would end after the deadline.
    let ThrottleError::DeadlineExceeded {
        attempts,
        waited,
        would_wait,
        last_error,
    } = &e
    else {
        panic!("expected DeadlineExceeded, got {e:?}");
    };
    assert_eq!((*attempts, *waited, *would_wait), (2, S, Some(2 * S)));
    assert!(last_error.is_some());
    assert!(e.is_connect(), "{e}");
    assert!(e.to_string().contains("would wait 2s more"), "{e}");
}

#[tokio::test(start_paused = true)]
async fn a_deadline_that_passes_during_an_attempt_says_it_passed() {
    let url = silent_server().await;
    let throttle = Throttle::builder().deadline(3 * S).build().unwrap();
    let err = client(&throttle, None).get(&url).send().await.unwrap_err();
    let e = throttle_error(&err);
    assert_eq!(
        e,
        ThrottleError::DeadlineExceeded {
            attempts: 1,
            waited: Duration::ZERO,
            would_wait: None,
            last_error: None,
        }
    );
    assert!(
        e.to_string()
            .starts_with("deadline passed after 1 attempt "),
        "{e}"
    );
}
