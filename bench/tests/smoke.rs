//! Keeps `osprey-bench` from rotting: a one-second run against direct and osprey.
//!
//! Needs `mariadbd` and the `osprey-dispatcher`/`osprey-worker` binaries of the same
//! workspace (built by `cargo test --workspace`; found next to the bench binary, or in the
//! other profile's directory).

use std::process::Command;

#[test]
fn smoke_direct_and_osprey_point_select() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("bench.json");
    let out = Command::new(env!("CARGO_BIN_EXE_osprey-bench"))
        .args([
            "--targets",
            "direct,osprey",
            "--workloads",
            "point-select",
            "--clients",
            "4",
            "--workers",
            "2",
            "--duration",
            "1",
            "--warmup",
            "0",
            "--rows",
            "2000",
            "--wakeup-rounds",
            "200",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("running osprey-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "osprey-bench failed: {}\n{stdout}\n{stderr}",
        out.status
    );
    assert!(stdout.contains("headline"), "no headline in the output:\n{stdout}");

    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("JSON written")).expect("valid JSON");
    assert!(doc["machine"]["cores"].as_u64().unwrap_or(0) >= 1, "{doc:#}");
    assert!(
        doc["machine"]["wakeup"]["round_trip_us"].as_f64().unwrap_or(0.0) > 0.0,
        "{doc:#}"
    );
    assert!(
        stdout.contains("wake-up cost"),
        "no wake-up cost in the header:\n{stdout}"
    );
    let ratios = doc["ratios"].as_array().expect("ratios array");
    assert_eq!(ratios.len(), 1, "{doc:#}");
    assert_eq!(ratios[0]["ratio"], "osprey/direct", "{doc:#}");
    assert!(ratios[0]["median"].as_f64().unwrap_or(0.0) > 0.0, "{doc:#}");
    assert!(
        doc["command"].as_str().is_some_and(|c| c.contains("--targets")),
        "{doc:#}"
    );
    let results = doc["results"].as_array().expect("results array");
    assert_eq!(results.len(), 2, "{doc:#}");
    for (r, target) in results.iter().zip(["direct", "osprey"]) {
        assert_eq!(r["target"], target, "{r:#}");
        assert_eq!(r["workload"], "point-select", "{r:#}");
        assert_eq!(r["clients"], 4, "{r:#}");
        assert!(r["qps"].as_f64().unwrap_or(0.0) > 0.0, "{r:#}");
        assert_eq!(r["errors"], 0, "{r:#}");
        assert!(r["p50_us"].as_u64().unwrap_or(0) > 0, "{r:#}");
        assert!(r["p50_us"].as_u64() <= r["p99_us"].as_u64(), "{r:#}");
        let cpu = &r["cpu_us_per_query"];
        assert!(cpu["loadgen"].as_f64().is_some(), "{r:#}");
        assert!(cpu["mariadb"].as_f64().is_some(), "{r:#}");
        if target == "osprey" {
            assert!(cpu["dispatcher"].as_f64().is_some(), "{r:#}");
            assert!(cpu["workers"].as_f64().is_some(), "{r:#}");
        } else {
            assert!(cpu["dispatcher"].is_null(), "{r:#}");
        }
        let per = &r["per_query"];
        for group in ["loadgen", "mariadb"] {
            for field in ["user_us", "system_us", "voluntary_cs", "involuntary_cs"] {
                assert!(per[group][field].as_f64().is_some(), "{group}.{field}: {r:#}");
            }
        }
        // MariaDB sleeps between requests (several pipelined requests may share a wake-up).
        assert!(per["mariadb"]["voluntary_cs"].as_f64().unwrap_or(0.0) > 0.0, "{r:#}");
        assert!(per["machine_cs"].as_f64().unwrap_or(0.0) > 0.0, "{r:#}");
        assert_eq!(per["workers"].is_null(), target != "osprey", "{r:#}");
    }
}
