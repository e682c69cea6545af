//! The fencing scenario against a real S3-compatible server (moto under
//! `.ci/run`). Reported as ignored when `MEMWAL_TEST_S3_URI` is unset;
//! fails under `CI=true` in that case.

use memwal_testkit::s3_test_location;

use crate::fencing::fencing_scenario;

/// Same steps and failure modes as the in-memory fencing test, over S3's
/// conditional PUT (`If-None-Match: *`): also breaks if the S3 client does
/// not make WAL writes put-if-not-exists, or if LIST/HEAD on S3 mislead
/// tail discovery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[cfg_attr(
    not(memwal_s3_tests),
    ignore = "needs an S3 server: MEMWAL_TEST_S3_URI unset (eval \"$(scripts/s3-server.sh start)\")"
)]
async fn fencing_order_on_s3() {
    let Some(loc) = s3_test_location("wal-fencing-order") else {
        return;
    };
    fencing_scenario(loc.store.clone(), loc.root.clone()).await;
}
