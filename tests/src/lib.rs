pub mod failover_rig;
pub mod fault_proxy;
pub mod harness;
pub mod pki;
pub mod webdriver;
