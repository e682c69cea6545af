use std::time::Duration;

/// How often and how patiently a transient store failure is retried.
///
/// `max_attempts` counts the first try, so `1` means "never retry".
/// Backoff doubles from `initial_backoff` up to `max_backoff`, with jitter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total tries per request, including the first (at least 1).
    pub max_attempts: u32,
    /// Wait before the second try.
    pub initial_backoff: Duration,
    /// Upper bound on any single wait.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    /// 6 tries, 20 ms doubling to at most 2 s (about 4 s in total).
    fn default() -> Self {
        Self {
            max_attempts: 6,
            initial_backoff: Duration::from_millis(20),
            max_backoff: Duration::from_secs(2),
        }
    }
}

impl RetryPolicy {
    /// A policy that retries `max_attempts - 1` times without waiting; meant
    /// for tests whose faults are injected, not timed.
    pub fn immediate(max_attempts: u32) -> Self {
        Self {
            max_attempts,
            initial_backoff: Duration::ZERO,
            max_backoff: Duration::ZERO,
        }
    }

    /// Total tries, never less than one.
    pub fn attempts(&self) -> u32 {
        self.max_attempts.max(1)
    }

    /// Waits before try number `attempt + 1` (`attempt` counts from 1).
    pub async fn backoff(&self, attempt: u32) {
        let base = self
            .initial_backoff
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
            .min(self.max_backoff);
        if base.is_zero() {
            tokio::task::yield_now().await;
            return;
        }
        // Full jitter in [base/2, base] keeps retrying peers from lock-stepping.
        let half = base / 2;
        let jitter = half.mul_f64(rand::random::<f64>());
        tokio::time::sleep(half + jitter).await;
    }
}
