//! `read_bench`'s query forms of a table larger than the query budget:
//! each as SQL over Flight SQL against upstream's `LsmScanner` in
//! process, with how far each raised the process's peak RSS.

use std::time::Instant;

use arrow_flight::sql::client::FlightSqlServiceClient;
use lance::dataset::mem_wal::LsmScanner;

use crate::{pct, sql_client, Args, Upstream};

/// `field` of /proc/self/status (`VmHWM`, `VmRSS`), MiB; 0 where /proc
/// is not there.
fn status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// How far the resident set rose above where it was at the last
/// [`reset_peak`], MiB (`VmHWM` against the `VmRSS` then).
fn peak_growth_mib(at_reset: f64) -> f64 {
    (status_mib("VmHWM:") - at_reset).max(0.0)
}

/// Starts a new peak (Linux: `clear_refs` 5); returns the resident set
/// now, MiB.
fn reset_peak() -> f64 {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
    status_mib("VmRSS:")
}

/// Runs `sql`, streaming its result: rows and bytes received, nothing kept.
async fn sql_count(
    client: &mut FlightSqlServiceClient<tonic::transport::Channel>,
    sql: &str,
) -> Result<(usize, usize), String> {
    use futures::StreamExt;
    let info = client
        .execute(sql.to_string(), None)
        .await
        .map_err(|e| format!("{sql}: {e}"))?;
    let (mut rows, mut bytes) = (0, 0);
    for ep in info.endpoint {
        let ticket = ep.ticket.ok_or("no ticket")?;
        let mut stream = client.do_get(ticket).await.map_err(|e| e.to_string())?;
        while let Some(b) = stream.next().await {
            let b = b.map_err(|e| format!("{sql}: {e}"))?;
            rows += b.num_rows();
            bytes += b.get_array_memory_size();
        }
    }
    Ok((rows, bytes))
}

/// Upstream's scanner over its table now (a view read per call, its
/// writer's memtables), configured by `f`, streamed: rows and bytes.
async fn up_count(
    up: &Upstream,
    f: impl FnOnce(LsmScanner) -> Result<LsmScanner, String>,
) -> Result<(usize, usize), String> {
    use futures::StreamExt;
    let view = up.view().await?;
    let mut stream = f(up.scanner(&view).await?)?
        .try_into_stream()
        .await
        .map_err(|e| e.to_string())?;
    let (mut rows, mut bytes) = (0, 0);
    while let Some(b) = stream.next().await {
        let b = b.map_err(|e| e.to_string())?;
        rows += b.num_rows();
        bytes += b.get_array_memory_size();
    }
    Ok((rows, bytes))
}

/// The query forms of a table larger than the query budget: each as SQL
/// over Flight SQL (memwal, plan + DoGet, the result streamed to a client
/// in this process) against upstream's `LsmScanner` in process on the
/// same data, alternating, `a.scans` times each; with how far each side
/// raised this process's peak RSS above where it was (the client's share
/// is one batch at a time).
/// Upstream's `GROUP BY` is its scan of the column alone (no grouping):
/// a lower bound.
pub(crate) async fn query_forms(
    a: &Args,
    addr: std::net::SocketAddr,
    up: &Upstream,
) -> Result<(), String> {
    let mut client = sql_client(addr).await?;
    let total = a.base + a.sstable + a.memtable;
    let lo = a.base / 2;
    type Up = Box<dyn Fn(LsmScanner) -> Result<LsmScanner, String>>;
    let forms: Vec<(&str, String, Up)> = vec![
        (
            "count(*)",
            "SELECT count(*) FROM t".into(),
            Box::new(|s| s.project(&["id"]).map_err(|e| e.to_string())),
        ),
        ("full scan", "SELECT * FROM t".into(), Box::new(Ok)),
        (
            "one column",
            "SELECT v FROM t".into(),
            Box::new(|s| s.project(&["v"]).map_err(|e| e.to_string())),
        ),
        (
            "filter (100 ids, no index)",
            format!("SELECT * FROM t WHERE id >= {lo} AND id < {}", lo + 100),
            Box::new(move |s| {
                s.filter(&format!("id >= {lo} AND id < {}", lo + 100))
                    .map_err(|e| e.to_string())
            }),
        ),
        (
            "LIMIT 10",
            "SELECT * FROM t LIMIT 10".into(),
            Box::new(|s| s.limit(Some(10), None).map_err(|e| e.to_string())),
        ),
        (
            "GROUP BY (every row)",
            "SELECT substr(v, 1, 3) AS p, count(*) FROM t GROUP BY p".into(),
            Box::new(|s| s.project(&["v"]).map_err(|e| e.to_string())),
        ),
    ];
    println!(
        "\n### Query forms over {total} rows: Flight SQL (memwal) against `LsmScanner` in process \
         (upstream), {} each, alternating\n",
        a.scans
    );
    println!(
        "| form | memwal rows | memwal median s | upstream median s | memwal / upstream speed | \
         memwal MB/s | memwal peak RSS growth MiB | upstream peak RSS growth MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (name, sql, f) in &forms {
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        let mut got = (0, 0);
        let (mut rss_ours, mut rss_up) = (0f64, 0f64);
        for _ in 0..a.scans {
            let at = reset_peak();
            let t = Instant::now();
            got = sql_count(&mut client, sql).await?;
            ours.push(t.elapsed().as_secs_f64());
            rss_ours = rss_ours.max(peak_growth_mib(at));
            let at = reset_peak();
            let t = Instant::now();
            up_count(up, f).await?;
            theirs.push(t.elapsed().as_secs_f64());
            rss_up = rss_up.max(peak_growth_mib(at));
        }
        let (o, u) = (pct(&mut ours, 0.5), pct(&mut theirs, 0.5));
        println!(
            "| {name} | {} | {o:.3} | {u:.3} | {:.2} | {:.0} | {rss_ours:.0} | {rss_up:.0} |",
            got.0,
            u / o,
            got.1 as f64 / o / 1e6,
        );
    }
    Ok(())
}
