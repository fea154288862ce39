//! Running commands, and the environment's long-lived processes, which are tracked by pid files.

use std::fs::{self, OpenOptions};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};

/// Runs a command with inherited output, failing if it exits non-zero.
pub fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("cannot run `{}`", show(cmd)))?;
    ensure!(status.success(), "`{}` failed ({status})", show(cmd));
    Ok(())
}

/// Runs a command with `input` on its standard input, failing if it exits non-zero.
pub fn with_input(cmd: &mut Command, input: &str) -> Result<()> {
    let mut child = cmd.stdin(Stdio::piped()).spawn().with_context(|| format!("cannot run `{}`", show(cmd)))?;
    child.stdin.take().context("a pipe to the command")?.write_all(input.as_bytes())?;
    let status = child.wait()?;
    ensure!(status.success(), "`{}` failed ({status})", show(cmd));
    Ok(())
}

/// Runs a command and returns its stdout, failing with its stderr if it exits non-zero.
pub fn capture(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("cannot run `{}`", show(cmd)))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    ensure!(out.status.success(), "`{}` failed ({}): {}", show(cmd), out.status, stderr.trim());
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether a command runs and exits zero; its output is discarded.
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

fn show(cmd: &Command) -> String {
    let mut parts = vec![cmd.get_program().to_string_lossy().into_owned()];
    parts.extend(cmd.get_args().map(|a| a.to_string_lossy().into_owned()));
    parts.join(" ")
}

/// The last `n` lines of a text file, or a note that it can't be read.
pub fn tail(path: &Path, n: usize) -> String {
    match fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Turns Ctrl-C into a flag, so `test` can still stop the environment. The foreground child gets the
/// signal too and exits, and the step that ran it fails.
pub fn catch_interrupts() {
    extern "C" fn on_sigint(_: libc::c_int) {
        INTERRUPTED.store(true, Ordering::SeqCst);
    }
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// A minimal HTTP/1.0 GET on loopback, enough for health checks without an HTTP client dependency.
/// Returns the status code and body.
pub fn http_get(port: u16, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = token.map(|t| format!("X-Consul-Token: {t}\r\n")).unwrap_or_default();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{auth}\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_owned()))
}

/// A background process of the environment, with `<name>.log` and `<name>.pid` in the run dir.
pub struct Daemon {
    pub name: &'static str,
    dir: PathBuf,
}

impl Daemon {
    pub fn new(name: &'static str, dir: &Path) -> Self {
        Self { name, dir: dir.to_owned() }
    }

    pub fn log(&self) -> PathBuf {
        self.dir.join(format!("{}.log", self.name))
    }

    fn pid_file(&self) -> PathBuf {
        self.dir.join(format!("{}.pid", self.name))
    }

    /// The recorded pid, if that process is still alive and is still the one we started.
    pub fn pid(&self) -> Option<u32> {
        let recorded = fs::read_to_string(self.pid_file()).ok()?;
        let (pid, started) = recorded.trim().split_once(' ')?;
        let pid = pid.parse().ok()?;
        let (state, start_time) = proc_stat(pid)?;
        (state != 'Z' && start_time.to_string() == started).then_some(pid)
    }

    /// Starts the command unless the process is already running it. One running another command
    /// line (an older binary or other flags, after an xtask change) is restarted.
    pub fn ensure_started(&self, cmd: &mut Command) -> Result<()> {
        match self.pid() {
            Some(pid) if fs::read(format!("/proc/{pid}/cmdline")).ok() == Some(argv(cmd)) => {
                println!("{} is already running (pid {pid})", self.name);
                Ok(())
            }
            Some(pid) => {
                println!("{} (pid {pid}) runs an outdated command line; restarting it", self.name);
                self.stop()?;
                self.start(cmd)
            }
            None => self.start(cmd),
        }
    }

    /// Starts the command detached from our process group (so it outlives `up` and ignores Ctrl-C
    /// meant for us), logging to the log file, and records its pid.
    fn start(&self, cmd: &mut Command) -> Result<()> {
        let mut log = OpenOptions::new().create(true).append(true).open(self.log())?;
        writeln!(log, "\n=== cargo xtask env up: {}", show(cmd))?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start {}", self.name))?;
        let (_, start_time) = proc_stat(child.id()).context("the new process vanished")?;
        fs::write(self.pid_file(), format!("{} {start_time}\n", child.id()))?;
        println!("started {} (pid {}), log {}", self.name, child.id(), self.log().display());
        Ok(())
    }

    /// Stops the recorded process: SIGTERM, then SIGKILL if it is still there after a grace period.
    pub fn stop(&self) -> Result<()> {
        match self.pid() {
            None => println!("{} is not running", self.name),
            Some(pid) => {
                signal(pid, libc::SIGTERM);
                if !self.wait_gone(pid, Duration::from_secs(20)) {
                    println!("{} (pid {pid}) ignored SIGTERM; sending SIGKILL", self.name);
                    signal(pid, libc::SIGKILL);
                    ensure!(self.wait_gone(pid, Duration::from_secs(5)), "{} (pid {pid}) survived SIGKILL", self.name);
                }
                println!("stopped {} (pid {pid})", self.name);
            }
        }
        match fs::remove_file(self.pid_file()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    fn wait_gone(&self, pid: u32, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            // Reap it if it is our own child (when `test` started it); harmless otherwise.
            // SAFETY: waitpid with WNOHANG and a null status pointer has no memory effects.
            unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
            if self.pid().is_none() {
                return true;
            }
            if Instant::now() > deadline {
                return false;
            }
            sleep(Duration::from_millis(100));
        }
    }

    /// Polls `ready` until it holds, failing early if the process exits, and with the log's tail on timeout.
    pub fn wait_ready(&self, what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
        let start = Instant::now();
        loop {
            if ready() {
                return Ok(());
            }
            if self.pid().is_none() {
                bail!(self.failure(&format!("exited while waiting for {what}")));
            }
            if start.elapsed() > timeout {
                bail!(self.failure(&format!("was not {what} after {}s", timeout.as_secs())));
            }
            if interrupted() {
                bail!("interrupted");
            }
            sleep(Duration::from_millis(500));
        }
    }

    fn failure(&self, problem: &str) -> String {
        let log = self.log();
        format!("{} {problem}; its log is {}. Last lines:\n{}", self.name, log.display(), tail(&log, 30))
    }
}

/// The command line as the kernel shows it in /proc/<pid>/cmdline: each argument NUL-terminated.
fn argv(cmd: &Command) -> Vec<u8> {
    let mut argv = Vec::new();
    for arg in std::iter::once(cmd.get_program()).chain(cmd.get_args()) {
        argv.extend_from_slice(arg.as_bytes());
        argv.push(0);
    }
    argv
}

fn signal(pid: u32, sig: libc::c_int) {
    // SAFETY: kill(2) has no memory effects; a stale pid only makes it fail with ESRCH.
    unsafe { libc::kill(pid as libc::pid_t, sig) };
}

/// State and start time (clock ticks since boot) from /proc/<pid>/stat. The start time tells a
/// reused pid apart from ours.
fn proc_stat(pid: u32) -> Option<(char, u64)> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name in field 2 may contain spaces, so count fields after its closing parenthesis.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some((fields.first()?.chars().next()?, fields.get(19)?.parse().ok()?))
}
