//! A real etcd server for the cluster tests: [`EtcdServer::start`] runs the
//! `etcd` binary (`MEMWAL_TEST_ETCD_BIN`, or `etcd` on `PATH`; Debian's
//! `etcd-server`, which `.ci/run` installs) on free local ports with its data
//! in a temporary directory, and waits until it answers `/health`. It can be
//! stopped and started again on the same ports and data (an etcd restart),
//! and is killed when dropped.
//!
//! Tests that need it mark themselves
//! `#[cfg_attr(not(memwal_etcd_tests), ignore = "...")]` (build script
//! `etcd_tests_cfg.rs`): without etcd they are reported as ignored, and
//! under `CI=true` a missing etcd fails them.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable naming the etcd binary (default: `etcd`).
pub const ETCD_BIN_ENV: &str = "MEMWAL_TEST_ETCD_BIN";

/// One etcd process (one member cluster) on local ports.
pub struct EtcdServer {
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    child: Option<Child>,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free local port")
}

impl EtcdServer {
    /// Starts etcd and waits (up to 30 s) until it is healthy. Panics with
    /// what is missing when it cannot.
    pub fn start() -> Self {
        // A free port may be taken by another process before etcd binds
        // it: a few tries on new ports.
        for attempt in 1.. {
            let mut server = Self {
                dir: tempfile::tempdir().expect("a temporary directory for etcd"),
                client_port: free_port(),
                peer_port: free_port(),
                child: None,
            };
            match server.try_start() {
                Ok(()) => return server,
                Err(log) if attempt < 5 && log.contains("address already in use") => continue,
                Err(log) => panic!("etcd did not start; its log:\n{log}"),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// The client endpoint (`http://127.0.0.1:PORT`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// Where etcd writes its log.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("etcd.log")
    }

    /// Starts the stopped server again on the same ports and data.
    pub fn start_again(&mut self) {
        if let Err(log) = self.try_start() {
            panic!("etcd did not start again; its log:\n{log}");
        }
    }

    /// Starts etcd and waits until it is healthy; `Err` with its log when
    /// it exits or is not healthy within 30 s.
    fn try_start(&mut self) -> Result<(), String> {
        assert!(self.child.is_none(), "etcd is running");
        let bin = std::env::var(ETCD_BIN_ENV)
            .ok()
            .filter(|b| !b.trim().is_empty())
            .unwrap_or_else(|| "etcd".into());
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .expect("etcd's log file");
        let child = Command::new(&bin)
            .arg("--name=memwal-test")
            .arg(format!(
                "--data-dir={}",
                self.dir.path().join("data").display()
            ))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=memwal-test={peer}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("etcd's log file"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "running `{bin}` failed ({e}): the cluster tests need etcd \
                     (Debian: apt-get install etcd-server; or set {ETCD_BIN_ENV})"
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.healthy() {
            let exited = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.child = None;
                return Err(format!("(exited with {status})\n{}", self.log()));
            }
            if Instant::now() >= deadline {
                self.stop();
                return Err(format!("(not healthy within 30 s)\n{}", self.log()));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Stops the server (SIGKILL) and waits for it; its data stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Whether `/health` answers healthy.
    fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.client_port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let request = format!(
            "GET /health HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n",
            self.client_port
        );
        if s.write_all(request.as_bytes()).is_err() {
            return false;
        }
        let mut body = String::new();
        let _ = s.read_to_string(&mut body);
        body.contains("\"health\":\"true\"")
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.stop();
    }
}
