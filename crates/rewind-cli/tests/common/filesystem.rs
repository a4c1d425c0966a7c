//! A filesystem on a volume, as its users have one: ext4 through nbdfuse
//! and a loop device, mounted; torn down even when an assertion fails.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Loop devices and FUSE mounts, torn down even when an assertion fails.
pub struct FsTest {
    pub fuse: PathBuf,
    pub fuse_view: PathBuf,
    pub mnt: PathBuf,
    pub old: PathBuf,
    loops: Vec<String>,
    fuses: Vec<Child>,
}

/// Filesystem tests share the kernel's mounts and `sync`, which waits for
/// every filesystem, frozen ones too: they run one after another.
static KERNEL_MOUNTS: Mutex<()> = Mutex::new(());

/// How long the kernel may take to let go of a mount or loop device.
const SETTLE: Duration = Duration::from_secs(30);

impl FsTest {
    pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
        // A failed test poisons the lock; the next one still runs.
        KERNEL_MOUNTS.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Mount points and FUSE directories under `dir`, nothing attached yet.
    pub fn new(dir: &Path) -> FsTest {
        let paths = ["fuse", "fuse-view", "mnt", "old"].map(|name| dir.join(name));
        for path in &paths {
            fs::create_dir(path).unwrap();
        }
        let [fuse, fuse_view, mnt, old] = paths;
        FsTest { fuse, fuse_view, mnt, old, loops: Vec::new(), fuses: Vec::new() }
    }

    /// Unmounts, detaches and ends every client: the volumes are free. The
    /// kernel lets go of a mount or loop device asynchronously (a device
    /// still open when `losetup -d` runs is detached on its last close, and
    /// its FUSE file is busy until then), so each step waits until it took
    /// effect; one that never does is forced and reported with a picture
    /// of the machine, instead of a wait that never ends.
    pub fn detach(&mut self) {
        let mut forced = Vec::new();
        for mount in [&self.old, &self.mnt] {
            release_mount(mount, "umount", &mut forced);
        }
        for device in self.loops.drain(..) {
            let mut command = Command::new("losetup");
            command.args(["-d", &device]);
            let _ = super::output_within(command, SETTLE);
            let backing = format!("/sys/block/{}/loop/backing_file", device.trim_start_matches("/dev/"));
            if !settles(|| !Path::new(&backing).exists()) {
                forced.push(format!("{device} was still attached {SETTLE:?} after losetup -d"));
            }
        }
        for dir in [&self.fuse_view, &self.fuse] {
            release_mount(dir, "fusermount3", &mut forced);
        }
        for mut child in self.fuses.drain(..) {
            if !settles(|| matches!(child.try_wait(), Ok(Some(_)))) {
                forced.push(format!("nbdfuse {} was still running {SETTLE:?} after its unmount; killed", child.id()));
                let _ = child.kill();
            }
        }
        if !forced.is_empty() {
            eprintln!("tearing down a filesystem test needed force: {}\n{}", forced.join("; "), super::diagnose());
        }
    }
    /// Exposes an NBD export as a file with nbdfuse and attaches a loop device.
    pub fn attach(&mut self, uri: &str, dir: &Path, read_only: bool) -> String {
        let file = dir.join("disk");
        let pidfile = dir.with_extension("pid");
        // Left by an earlier nbdfuse on this directory.
        let _ = fs::remove_file(&pidfile);
        let mut command = Command::new("nbdfuse");
        command.arg("-P").arg(&pidfile);
        if read_only {
            command.arg("--readonly");
        }
        let child = command.arg(&file).arg(uri).spawn().expect("nbdfuse runs");
        self.fuses.push(child);
        // nbdfuse writes its pid file once the file is ready to use.
        super::wait_for("nbdfuse to be ready", || pidfile.exists());
        let mut losetup = vec!["-f", "--show"];
        if read_only {
            losetup.push("-r");
        }
        let file_arg = file.to_str().unwrap().to_owned();
        losetup.push(&file_arg);
        let device = super::run("losetup", &losetup).trim().to_owned();
        self.loops.push(device.clone());
        device
    }
}

impl Drop for FsTest {
    fn drop(&mut self) {
        self.detach();
    }
}

/// Unmounts `path` if it is mounted (`umount PATH` or `fusermount3 -u PATH`),
/// retrying while it is busy; after [`SETTLE`], detaches it lazily and notes
/// that in `forced`.
fn release_mount(path: &Path, program: &str, forced: &mut Vec<String>) {
    let unmount = |lazy: bool| {
        let flag = match (program, lazy) {
            ("fusermount3", true) => Some("-uz"),
            ("fusermount3", false) => Some("-u"),
            (_, true) => Some("-l"),
            (_, false) => None,
        };
        let mut command = Command::new(program);
        command.args(flag).arg(path);
        let _ = super::output_within(command, SETTLE);
    };
    let unmounted = settles(|| {
        if is_mounted(path) {
            unmount(false);
        }
        !is_mounted(path)
    });
    if unmounted {
        return;
    }
    unmount(true);
    forced.push(format!("{} was still busy after {SETTLE:?}; detached lazily", path.display()));
}

fn is_mounted(path: &Path) -> bool {
    let mounts = fs::read_to_string("/proc/self/mountinfo").expect("/proc/self/mountinfo");
    // The fifth field is the mount point (these paths have no spaces to escape).
    mounts.lines().any(|line| line.split(' ').nth(4) == Some(path.to_str().unwrap()))
}

/// Polls `condition` until it holds or [`SETTLE`] passes; says which.
fn settles(mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + SETTLE;
    while !condition() {
        if Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}
