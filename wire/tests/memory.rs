//! Rows are yielded one at a time: streaming a result far larger than memory bounds leaves
//! this process's peak RSS (`VmHWM`, its own process: one test in this file) nearly flat.

mod common;

use common::opts;
use osprey_sandbox::Sandbox;
use osprey_wire::{Event, Session};

fn peak_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("procfs");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

#[tokio::test]
async fn streaming_300_mb_keeps_peak_memory_flat() -> anyhow::Result<()> {
    let sandbox = Sandbox::start(0).await?;
    let mut s = Session::connect(&opts(sandbox.primary())).await?;
    // Warm up buffers and the allocator with a small result first.
    s.query_drop("SELECT REPEAT('w', 1000) FROM seq_1_to_1000").await?;
    let before = peak_rss_kib();
    s.send_query("SELECT seq, REPEAT('m', 1000) FROM seq_1_to_300000")?;
    let (mut rows, mut bytes) = (0u64, 0u64);
    loop {
        match s.next_event().await? {
            Event::Row(r) => {
                rows += 1;
                if let Some(osprey_wire::Value::Bytes(b)) = r.as_ref(1) {
                    bytes += b.len() as u64;
                }
            }
            Event::End {
                more_results: false, ..
            } => break,
            _ => {}
        }
    }
    let grown = peak_rss_kib().saturating_sub(before);
    eprintln!("peak RSS: {before} KiB before, grew by {grown} KiB");
    assert_eq!(rows, 300_000);
    assert_eq!(bytes, 300_000_000);
    assert!(grown < 32 * 1024, "peak RSS grew by {grown} KiB while streaming 300 MB");
    Ok(())
}
