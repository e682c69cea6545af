//! Two writers on one shard.

use memwal::Error;

use crate::support::*;

// Breaks if a fenced writer can still acknowledge a put (its WAL append
// must collide with the newer writer's sentinel), if the fence is not
// terminal, or if the newer writer does not replay the older one's
// acknowledged rows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_writer_is_fenced_on_next_put_and_newer_replays() {
    let t = TestTable::new().await;
    let w1 = t.open(config()).await.unwrap();
    let schema = table_schema(&w1);
    let mut model = Model::new();
    w1.put(&rows(&[1, 2], "old")).await.unwrap();
    model_put(&mut model, &[1, 2], "old");

    let w2 = t.open(config()).await.unwrap();
    assert_eq!(w2.epoch(), w1.epoch() + 1);
    assert_eq!(
        t.read_published(&schema).await,
        model,
        "w2 replayed w1's rows"
    );

    let err = w1.put(&rows(&[3], "late")).await.unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
    // Terminal: every later call returns the same kind.
    assert!(matches!(
        w1.put(&rows(&[4], "x")).await,
        Err(Error::Fenced { .. })
    ));
    assert!(matches!(w1.flush().await, Err(Error::Fenced { .. })));
    assert!(w1.stats().terminal.is_some());

    w2.put(&rows(&[2], "new")).await.unwrap();
    model_put(&mut model, &[2], "new");
    w2.close().await.unwrap();
    assert_eq!(t.read_published(&schema).await, model);
    assert!(!model.contains_key(&3), "the fenced put never landed");
}

// Breaks if a fenced writer's publish is not refused by the manifest
// epoch check, or if that refusal does not make the writer terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn older_writer_is_fenced_on_publish() {
    let t = TestTable::new().await;
    let w1 = t.open(config()).await.unwrap();
    let schema = table_schema(&w1);
    w1.put(&rows(&[1, 2], "old")).await.unwrap();
    let w2 = t.open(config()).await.unwrap();
    let published_by_w2 = t.manifest().await;

    let err = w1.flush().await.unwrap_err();
    assert!(matches!(err, Error::Fenced { .. }), "{err}");
    assert!(matches!(
        w1.put(&rows(&[5], "x")).await,
        Err(Error::Fenced { .. })
    ));
    let m = t.manifest().await;
    assert_eq!(m.sstables, published_by_w2.sstables, "w1 published nothing");
    assert_eq!(m.writer_epoch, w2.epoch());

    let mut model = Model::new();
    model_put(&mut model, &[1, 2], "old");
    assert_eq!(t.read_published(&schema).await, model);
    w2.close().await.unwrap();
}
