//! The polling loop against real MariaDB servers (a sandbox primary and two replicas) that
//! serve a table with the columns of `performance_schema.replication_group_members`: the
//! rows are written on the primary and replicated, so every member reports the same view,
//! as a group's members do. No group elects anything here; the test drives the rows.

use std::sync::Arc;
use std::time::Duration;

use mysql_async::prelude::Queryable;
use osprey_sandbox::Sandbox;
use tokio::sync::{oneshot, watch};
use tokio_util::sync::CancellationToken;

use super::spawn_with_sql;
use crate::cluster::config::{ClusterConfig, HealthConfig, MemberConfig, Topology};
use crate::cluster::events::EventLog;
use crate::cluster::view::{ClusterStatus, ClusterView, Command, Role};
use crate::metrics::{MemberLabel, Metrics};

const SQL: &str = "SELECT MEMBER_HOST, MEMBER_PORT, MEMBER_STATE, MEMBER_ROLE FROM osprey.group_members";

fn config(sandbox: &Sandbox) -> ClusterConfig {
    ClusterConfig {
        name: "gr".into(),
        topology: Topology::GroupReplication,
        user: osprey_sandbox::APP_USER.into(),
        password: osprey_sandbox::APP_PASSWORD.into(),
        database: None,
        monitor_user: None,
        monitor_password: None,
        replication_user: None,
        replication_password: None,
        connect_timeout_ms: 1_000,
        session_reset: Default::default(),
        ssl_mode: Default::default(),
        ssl_ca: None,
        ssl_server_name: None,
        read_split: false,
        read_fallback: Default::default(),
        members: sandbox
            .instances()
            .map(|i| MemberConfig::new(i.name(), i.host(), i.port()))
            .collect(),
        health: HealthConfig {
            interval_ms: 100,
            window_ms: 1_000,
            ..Default::default()
        },
        failover: Default::default(),
        delay_period_ms: None,
        delay_threshold_ms: None,
        delay_database: None,
    }
}

async fn wait_view(
    rx: &mut watch::Receiver<ClusterView>,
    what: &str,
    ok: impl Fn(&ClusterView) -> bool,
) -> ClusterView {
    let within = Duration::from_secs(10);
    let deadline = tokio::time::Instant::now() + within;
    loop {
        {
            let v = rx.borrow_and_update();
            if ok(&v) {
                return v.clone();
            }
        }
        if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
            panic!("{what}: not within {within:?}; last view: {:#?}", *rx.borrow());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_the_rows_served_by_real_servers() {
    let sandbox = Sandbox::start(2).await.unwrap();
    let names: Vec<String> = sandbox.instances().map(|i| i.name().to_owned()).collect();
    let port = |i: usize| sandbox.instances().nth(i).unwrap().port();
    let mut p = sandbox.primary().conn().await.unwrap();
    p.query_drop(
        "CREATE TABLE osprey.group_members (MEMBER_HOST VARCHAR(255), MEMBER_PORT INT, \
         MEMBER_STATE VARCHAR(64), MEMBER_ROLE VARCHAR(64))",
    )
    .await
    .unwrap();
    let set_rows = |rows: Vec<(u16, &'static str, &'static str)>| {
        let values = rows
            .iter()
            .map(|(port, state, role)| format!("('127.0.0.1', {port}, '{state}', '{role}')"))
            .collect::<Vec<_>>()
            .join(", ");
        format!("DELETE FROM osprey.group_members; INSERT INTO osprey.group_members VALUES {values}")
    };
    p.query_drop(set_rows(vec![
        (port(0), "ONLINE", "PRIMARY"),
        (port(1), "ONLINE", "SECONDARY"),
        (port(2), "RECOVERING", "SECONDARY"),
    ]))
    .await
    .unwrap();

    let (_cfg_tx, cfg_rx) = watch::channel(Arc::new(config(&sandbox)));
    let events = Arc::new(EventLog::default());
    let metrics = Arc::new(Metrics::new());
    let shutdown = CancellationToken::new();
    let handle = spawn_with_sql(
        cfg_rx,
        Vec::new(),
        events.clone(),
        metrics.clone(),
        shutdown.clone(),
        SQL,
    );
    let mut view = handle.view.clone();

    let v = wait_view(&mut view, "first primary", |v| v.primary.is_some()).await;
    assert_eq!(v.primary.as_deref(), Some(names[0].as_str()));
    assert_eq!(v.member(&names[1]).unwrap().role, Role::Replica);
    let recovering = v.member(&names[2]).unwrap();
    assert_eq!(recovering.role, Role::Detached, "{recovering:?}");
    assert_eq!(recovering.state.as_deref(), Some("RECOVERING"));
    let gauge = |m: &str| {
        metrics
            .group_primary
            .get_or_create(&MemberLabel {
                cluster: "gr".into(),
                member: m.into(),
            })
            .get()
    };
    assert_eq!(gauge(&names[0]), 1);

    // The group elects another primary: followed within a few rounds, logged, epoch bumped.
    p.query_drop(set_rows(vec![
        (port(0), "ONLINE", "SECONDARY"),
        (port(1), "ONLINE", "PRIMARY"),
        (port(2), "ONLINE", "SECONDARY"),
    ]))
    .await
    .unwrap();
    let v = wait_view(&mut view, "primary change", |v| {
        v.primary.as_deref() == Some(names[1].as_str())
    })
    .await;
    assert_eq!(v.epoch, 2);
    assert!(v.members.iter().all(|m| m.role != Role::Detached), "{v:#?}");
    let ev = events.list(Some("gr")).last().cloned().unwrap();
    assert_eq!(
        (ev.kind, ev.old_primary.as_deref(), ev.new_primary.as_deref()),
        ("followed", Some(names[0].as_str()), Some(names[1].as_str()))
    );

    // Its server dies and the group expels it and elects the third: the others' view wins.
    sandbox.replicas()[0].kill();
    p.query_drop(set_rows(vec![
        (port(0), "ONLINE", "SECONDARY"),
        (port(2), "ONLINE", "PRIMARY"),
    ]))
    .await
    .unwrap();
    let v = wait_view(&mut view, "primary after expulsion", |v| {
        v.primary.as_deref() == Some(names[2].as_str())
    })
    .await;
    let dead = v.member(&names[1]).unwrap();
    assert_eq!(dead.role, Role::Detached);
    assert!(
        dead.reason.as_deref().unwrap_or("").starts_with("unreachable"),
        "{dead:?}"
    );

    // No ONLINE primary: no primary, and the status says why.
    p.query_drop(set_rows(vec![
        (port(0), "ONLINE", "SECONDARY"),
        (port(2), "ERROR", "PRIMARY"),
    ]))
    .await
    .unwrap();
    let v = wait_view(&mut view, "no primary", |v| v.primary.is_none()).await;
    assert!(matches!(&v.status, ClusterStatus::NoPrimary(_)), "{:?}", v.status);

    // Osprey never promotes in this topology.
    let (tx, rx) = oneshot::channel();
    handle
        .commands
        .send(Command::Switchover {
            to: Some(names[0].clone()),
            reply: tx,
        })
        .await
        .unwrap();
    assert!(rx.await.unwrap().is_err());
    shutdown.cancel();
}
