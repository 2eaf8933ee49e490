//! The runtime directory and the credentials file.

use std::os::unix::fs::PermissionsExt;

use osprey_client::local::{runtime_dir, Credentials};

#[test]
fn credentials_roundtrip_with_mode_0600() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("osprey");
    let c = Credentials {
        client_token: "c-123".into(),
        admin_token: "a-456".into(),
        mysql: String::new(),
    };
    c.store(&sub).unwrap();
    let path = Credentials::path(&sub);
    assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(&sub).unwrap().permissions().mode() & 0o777, 0o700);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "client_token=c-123\nadmin_token=a-456\n"
    );
    assert_eq!(Credentials::load(&sub).unwrap(), c);
    // Overwrite in place.
    let c2 = Credentials {
        client_token: "new".into(),
        ..c.clone()
    };
    c2.store(&sub).unwrap();
    assert_eq!(Credentials::load(&sub).unwrap(), c2);
    // The MySQL port's generated login, when there is one.
    let c3 = Credentials {
        mysql: "mariadb -h127.0.0.1 -P6033 -uosprey -psecret".into(),
        ..c2.clone()
    };
    c3.store(&sub).unwrap();
    assert!(std::fs::read_to_string(&path)
        .unwrap()
        .ends_with("\nmysql=mariadb -h127.0.0.1 -P6033 -uosprey -psecret\n"));
    assert_eq!(Credentials::load(&sub).unwrap(), c3);
    assert_eq!(
        Credentials::parse("# comment\n\nadmin_token = x \nother=1\n"),
        Credentials {
            client_token: String::new(),
            admin_token: "x".into(),
            mysql: String::new(),
        }
    );
    assert!(Credentials::load(&dir.path().join("missing")).is_err());
}

// The only test in this binary that touches the environment.
#[test]
fn runtime_dir_precedence() {
    std::env::set_var("OSPREY_RUNTIME_DIR", "/run/custom");
    std::env::set_var("XDG_RUNTIME_DIR", "/run/user/1000");
    assert_eq!(runtime_dir(), std::path::PathBuf::from("/run/custom"));
    std::env::remove_var("OSPREY_RUNTIME_DIR");
    assert_eq!(runtime_dir(), std::path::PathBuf::from("/run/user/1000/osprey"));
    std::env::remove_var("XDG_RUNTIME_DIR");
    let uid = unsafe { libc_getuid() };
    assert_eq!(runtime_dir(), std::path::PathBuf::from(format!("/tmp/osprey-{uid}")));
}

extern "C" {
    #[link_name = "getuid"]
    fn libc_getuid() -> u32;
}
