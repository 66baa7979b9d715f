//! The bytes of the blocks the tiers hold: host memory first, then files with checksums.
//!
//! A file is `HEADER_BYTES` of header — magic `KVLABTR1`, group (u32), entry (u64), payload
//! length (u64), CRC-32 of the payload (u32), little-endian — then the payload. It is read
//! back only if the file has exactly the length this run wrote and every header field and the
//! checksum match, so a truncated, corrupt, swapped or missing file is a miss and never a
//! wrong block (nor an allocation sized by a header).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::{TierConfig, TierKey};
use crate::{PagedError, Result};

const MAGIC: &[u8; 8] = b"KVLABTR1";
/// Bytes before a file's payload.
const HEADER_BYTES: usize = 8 + 4 + 8 + 8 + 4;

/// What the store holds and moved, in bytes, and what went wrong with files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct TierStoreStats {
    /// Blocks in host memory now.
    pub host_blocks: usize,
    /// Bytes in host memory now.
    pub host_bytes: u64,
    /// Blocks in files now.
    pub disk_blocks: usize,
    /// Payload bytes in files now.
    pub disk_bytes: u64,
    /// Bytes spilled from the pools so far.
    pub bytes_spilled: u64,
    /// Bytes restored into the pools so far.
    pub bytes_restored: u64,
    /// Bytes written to files so far (blocks moved from host memory to disk).
    pub bytes_written_to_disk: u64,
    /// Bytes read back from files so far (verified).
    pub bytes_read_from_disk: u64,
    /// Blocks restored into the pools so far that were in host memory when their request was
    /// admitted.
    pub blocks_restored_from_host: u64,
    /// Blocks restored into the pools so far that were on disk when their request was admitted,
    /// and were read back from files for it.
    pub blocks_restored_from_disk: u64,
    /// Blocks restored into the pools so far that the remote tier fetched for their request.
    pub blocks_restored_from_remote: u64,
    /// Files that could not be written (disk full, read-only): those blocks were dropped.
    pub disk_write_errors: u64,
    /// Files missing, truncated or failing their checksum: those blocks were misses.
    pub disk_read_errors: u64,
}

/// The run's files: one per block, in a directory of its own.
#[derive(Debug)]
struct DiskTier {
    dir: PathBuf,
    /// Payload bytes of each block written.
    files: HashMap<TierKey, usize>,
}

impl Drop for DiskTier {
    fn drop(&mut self) {
        // The files name entries of this run only; nothing else can use them.
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Host memory and an optional disk tier holding block bytes by [`TierKey`].
#[derive(Debug)]
pub struct KvTierStore {
    /// Blocks host memory keeps before moving the least recently stored to disk.
    host_capacity: usize,
    host: HashMap<TierKey, (u64, Box<[u8]>)>,
    /// stamp → key, least recently stored or read first.
    host_order: BTreeMap<u64, TierKey>,
    next: u64,
    disk: Option<DiskTier>,
    /// Keys in host memory because `ready` read them back from their files.
    from_disk: HashSet<TierKey>,
    /// Keys whose bytes the remote tier fetched.
    from_remote: HashSet<TierKey>,
    /// Keys [`Self::ready`] said yes to since [`Self::unpin_all`]: restores the step being
    /// built relies on, never moved out of host memory to make room for a block stored meanwhile
    /// (one the remote tier fetched for a later admission).
    pinned: HashSet<TierKey>,
    stats: TierStoreStats,
}

impl KvTierStore {
    /// The store for `num_groups` pools under `config` (`host_blocks` and `disk_blocks` per
    /// pool). The disk tier gets a fresh directory under `config.disk_dir`, removed when the
    /// store is dropped.
    ///
    /// # Errors
    /// [`PagedError::InvalidConfig`] for a disk tier without a directory;
    /// [`PagedError::Tier`] if the directory cannot be created or written (read-only,
    /// missing permissions).
    pub fn new(config: &TierConfig, num_groups: usize) -> Result<Self> {
        let disk = match (&config.disk_dir, config.disk_blocks) {
            (_, 0) => None,
            (None, _) => {
                return Err(PagedError::InvalidConfig(
                    "a disk tier of blocks needs a directory; set disk_dir (--disk-tier DIR)"
                        .into(),
                ));
            }
            (Some(root), _) => Some(DiskTier {
                dir: create_run_dir(root)?,
                files: HashMap::new(),
            }),
        };
        Ok(Self {
            host_capacity: config.host_blocks.saturating_mul(num_groups),
            host: HashMap::new(),
            host_order: BTreeMap::new(),
            next: 0,
            disk,
            from_disk: HashSet::new(),
            from_remote: HashSet::new(),
            pinned: HashSet::new(),
            stats: TierStoreStats::default(),
        })
    }

    /// The directory this run's files are in, if there is a disk tier.
    pub fn disk_dir(&self) -> Option<&Path> {
        self.disk.as_ref().map(|d| d.dir.as_path())
    }

    /// Sizes now and totals so far.
    pub fn stats(&self) -> TierStoreStats {
        let disk = self.disk.as_ref();
        TierStoreStats {
            host_blocks: self.host.len(),
            host_bytes: self.host.values().map(|(_, b)| b.len() as u64).sum(),
            disk_blocks: disk.map_or(0, |d| d.files.len()),
            disk_bytes: disk.map_or(0, |d| d.files.values().map(|&n| n as u64).sum()),
            ..self.stats
        }
    }

    /// Forgets which keys the step being built relies on ([`Self::ready`]): its moves are made,
    /// or it never ran.
    pub fn unpin_all(&mut self) {
        self.pinned.clear();
    }

    /// Whether `key` is held (host or disk; a file is not checked here).
    pub fn contains(&self, key: TierKey) -> bool {
        self.host.contains_key(&key)
            || self
                .disk
                .as_ref()
                .is_some_and(|d| d.files.contains_key(&key))
    }

    /// Where `key`'s bytes are and how many: `Some((on_disk, bytes))`, `None` if not held.
    /// Reads nothing.
    pub fn locate(&self, key: TierKey) -> Option<(bool, usize)> {
        if let Some((_, b)) = self.host.get(&key) {
            return Some((false, b.len()));
        }
        let d = self.disk.as_ref()?;
        d.files.get(&key).map(|&n| (true, n))
    }

    /// Stores a spilled block. When host memory is over capacity, its least recently stored
    /// blocks move to files (or are dropped without a disk tier). Returns the keys lost on the
    /// way (a file that could not be written), which the caller forgets.
    pub fn put(&mut self, key: TierKey, bytes: Box<[u8]>) -> Vec<TierKey> {
        self.stats.bytes_spilled += bytes.len() as u64;
        self.hold(key, bytes)
    }

    /// Keeps `key`'s bytes in host memory, moving the least recently stored down to files past
    /// capacity; returns the keys lost on the way.
    fn hold(&mut self, key: TierKey, bytes: Box<[u8]>) -> Vec<TierKey> {
        self.remove(key);
        self.insert_host(key, bytes);
        let mut lost = Vec::new();
        while self.host.len() > self.host_capacity {
            let pinned = &self.pinned;
            let Some((&stamp, &old)) = self.host_order.iter().find(|(_, k)| !pinned.contains(k))
            else {
                break;
            };
            self.host_order.remove(&stamp);
            let Some((_, bytes)) = self.host.remove(&old) else {
                continue;
            };
            let written = self.disk.as_mut().map(|d| write_block(&d.dir, old, &bytes));
            match written {
                Some(Ok(())) => {
                    self.stats.bytes_written_to_disk += bytes.len() as u64;
                    if let Some(d) = self.disk.as_mut() {
                        d.files.insert(old, bytes.len());
                    }
                }
                Some(Err(_)) => {
                    self.stats.disk_write_errors += 1;
                    if let Some(d) = self.disk.as_ref() {
                        let _ = fs::remove_file(file_path(&d.dir, old));
                    }
                    lost.push(old);
                }
                None => lost.push(old),
            }
        }
        lost
    }

    /// Stores a block that came from outside this run's pools (verified): fetched from the
    /// remote tier (`remote`), or read from a saved session. It is restored like a spilled one.
    /// Returns the keys lost on the way, as [`Self::put`] does.
    pub fn put_fetched(&mut self, key: TierKey, bytes: Box<[u8]>, remote: bool) -> Vec<TierKey> {
        let lost = self.hold(key, bytes);
        if remote {
            self.from_remote.insert(key);
        }
        lost
    }

    /// A copy of `key`'s bytes (host memory, or its file read and verified), leaving them where
    /// they are; `None` if not held or the file fails its checks.
    pub fn peek(&self, key: TierKey) -> Option<Vec<u8>> {
        if let Some((_, b)) = self.host.get(&key) {
            return Some(b.to_vec());
        }
        let d = self.disk.as_ref()?;
        let len = *d.files.get(&key)?;
        read_block(&file_path(&d.dir, key), key, len).map(Vec::from)
    }

    /// Whether `key`'s bytes came from the remote tier.
    pub fn came_from_remote(&self, key: TierKey) -> bool {
        self.from_remote.contains(&key)
    }

    /// Makes sure `key`'s bytes can be restored this step: held in host memory, or read from
    /// its file and verified (then kept in host memory until the restore). `false` when they
    /// are not held or the file is missing, truncated or corrupt (counted; the file is
    /// removed): the caller treats the level as a miss and forgets it.
    pub fn ready(&mut self, key: TierKey) -> bool {
        let ready = self.make_ready(key);
        if ready {
            self.pinned.insert(key);
        }
        ready
    }

    fn make_ready(&mut self, key: TierKey) -> bool {
        if let Some((stamp, _)) = self.host.get(&key) {
            let stamp = *stamp;
            self.host_order.remove(&stamp);
            self.host_order.insert(self.next, key);
            if let Some(e) = self.host.get_mut(&key) {
                e.0 = self.next;
            }
            self.next += 1;
            return true;
        }
        let Some(d) = self.disk.as_mut() else {
            return false;
        };
        let Some(len) = d.files.remove(&key) else {
            return false;
        };
        let path = file_path(&d.dir, key);
        let read = read_block(&path, key, len);
        let _ = fs::remove_file(&path);
        match read {
            Some(bytes) => {
                self.stats.bytes_read_from_disk += bytes.len() as u64;
                self.insert_host(key, bytes);
                self.from_disk.insert(key);
                true
            }
            None => {
                self.stats.disk_read_errors += 1;
                false
            }
        }
    }

    /// Takes `key`'s bytes out for a restore (after [`Self::ready`] said yes).
    pub fn take(&mut self, key: TierKey) -> Option<Box<[u8]>> {
        if !self.ready(key) {
            return None;
        }
        let (stamp, bytes) = self.host.remove(&key)?;
        self.host_order.remove(&stamp);
        self.pinned.remove(&key);
        self.stats.bytes_restored += bytes.len() as u64;
        if self.from_remote.remove(&key) {
            self.stats.blocks_restored_from_remote += 1;
            self.from_disk.remove(&key);
        } else if self.from_disk.remove(&key) {
            self.stats.blocks_restored_from_disk += 1;
        } else {
            self.stats.blocks_restored_from_host += 1;
        }
        Some(bytes)
    }

    /// Whether `key`'s bytes, ready in host memory, were read back from their file (a restore
    /// from disk rather than from host memory).
    pub fn came_from_disk(&self, key: TierKey) -> bool {
        self.from_disk.contains(&key)
    }

    /// Forgets `key` wherever it is (nothing if it is nowhere).
    pub fn remove(&mut self, key: TierKey) {
        self.from_disk.remove(&key);
        self.from_remote.remove(&key);
        self.pinned.remove(&key);
        if let Some((stamp, _)) = self.host.remove(&key) {
            self.host_order.remove(&stamp);
        }
        if let Some(d) = self.disk.as_mut()
            && d.files.remove(&key).is_some()
        {
            let _ = fs::remove_file(file_path(&d.dir, key));
        }
    }

    fn insert_host(&mut self, key: TierKey, bytes: Box<[u8]>) {
        self.host.insert(key, (self.next, bytes));
        self.host_order.insert(self.next, key);
        self.next += 1;
    }
}

/// A new, empty directory under `root` for this run's files.
fn create_run_dir(root: &Path) -> Result<PathBuf> {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let dir = root.join(format!("kvlab-tier-{}-{nanos}", std::process::id()));
    let fail = |e: std::io::Error| PagedError::Tier {
        path: dir.display().to_string(),
        reason: format!("{e}; choose a writable directory for the disk tier"),
    };
    fs::create_dir_all(&dir).map_err(fail)?;
    // A directory that can be created but not written (a full disk) fails here, not later.
    let probe = dir.join("probe");
    fs::write(&probe, b"kvlab").map_err(fail)?;
    fs::remove_file(&probe).map_err(fail)?;
    Ok(dir)
}

fn file_path(dir: &Path, key: TierKey) -> PathBuf {
    dir.join(format!("g{}-e{}.kvblock", key.group, key.entry))
}

fn write_block(dir: &Path, key: TierKey, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = Vec::with_capacity(HEADER_BYTES + bytes.len());
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(&key.group.to_le_bytes());
    file.extend_from_slice(&key.entry.to_le_bytes());
    file.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    file.extend_from_slice(&crc32fast::hash(bytes).to_le_bytes());
    file.extend_from_slice(bytes);
    fs::write(file_path(dir, key), file)
}

/// The payload of `key`'s file if it has exactly `len` payload bytes and matches its header
/// and checksum; `None` otherwise (never reads more than the length this run wrote).
fn read_block(path: &Path, key: TierKey, len: usize) -> Option<Box<[u8]>> {
    let meta = fs::metadata(path).ok()?;
    if meta.len() != (HEADER_BYTES + len) as u64 {
        return None;
    }
    let file = fs::read(path).ok()?;
    if file.len() != HEADER_BYTES + len {
        return None;
    }
    let (head, payload) = file.split_at(HEADER_BYTES);
    let u32_at = |i: usize| head[i..i + 4].try_into().ok().map(u32::from_le_bytes);
    let u64_at = |i: usize| head[i..i + 8].try_into().ok().map(u64::from_le_bytes);
    let ok = &head[..8] == MAGIC
        && u32_at(8)? == key.group
        && u64_at(12)? == key.entry
        && u64_at(20)? == len as u64
        && u32_at(28)? == crc32fast::hash(payload);
    ok.then(|| payload.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(entry: u64) -> TierKey {
        TierKey { group: 0, entry }
    }

    fn block(seed: u8, n: usize) -> Box<[u8]> {
        (0..n)
            .map(|i| seed.wrapping_mul(31).wrapping_add(i as u8))
            .collect()
    }

    #[test]
    fn a_block_checked_for_a_restore_is_never_pushed_out_before_it() {
        let config = TierConfig::host(2);
        let mut s = KvTierStore::new(&config, 1).unwrap();
        assert!(s.put(key(1), block(1, 8)).is_empty());
        assert!(s.put(key(2), block(2, 8)).is_empty());
        // An admission checks entry 1 (the oldest) for a restore; a later admission of the same
        // step stores a fetched block: entry 2 makes room, entry 1 stays for its restore.
        assert!(s.ready(key(1)));
        assert!(s.ready(key(1)));
        assert_eq!(s.put_fetched(key(3), block(3, 8), true), vec![key(2)]);
        assert_eq!(s.take(key(1)), Some(block(1, 8)));
        // Once the step's moves are made nothing is pinned: the oldest goes first again.
        assert!(s.ready(key(3)));
        s.unpin_all();
        assert!(s.put(key(4), block(4, 8)).is_empty());
        assert_eq!(s.put(key(5), block(5, 8)), vec![key(3)]);
        assert!(
            !s.contains(key(3)),
            "lost (no disk tier): the caller forgets it"
        );
    }

    #[test]
    fn host_overflow_goes_to_disk_and_comes_back_bit_identical() {
        let root = tempfile::tempdir().unwrap();
        let cfg = TierConfig::host(2).with_disk(root.path(), 8);
        let mut s = KvTierStore::new(&cfg, 1).unwrap();
        for e in 0..5 {
            assert!(s.put(key(e), block(e as u8, 100)).is_empty());
        }
        let st = s.stats();
        assert_eq!((st.host_blocks, st.disk_blocks), (2, 3));
        assert_eq!(st.bytes_written_to_disk, 300);
        for e in 0..5 {
            assert_eq!(s.take(key(e)).unwrap(), block(e as u8, 100), "entry {e}");
        }
        assert_eq!(s.stats().bytes_read_from_disk, 300);
        assert!(s.take(key(0)).is_none(), "a restore takes the bytes out");
    }

    #[test]
    fn a_corrupt_truncated_or_missing_file_is_a_miss() {
        let root = tempfile::tempdir().unwrap();
        let cfg = TierConfig::host(1).with_disk(root.path(), 8);
        let mut s = KvTierStore::new(&cfg, 1).unwrap();
        for e in 0..4 {
            s.put(key(e), block(e as u8, 64));
        }
        let dir = s.disk_dir().unwrap().to_path_buf();
        // Entry 0: one payload bit flipped. Entry 1: truncated. Entry 2: deleted.
        let p0 = file_path(&dir, key(0));
        let mut f = fs::read(&p0).unwrap();
        f[HEADER_BYTES + 10] ^= 1;
        fs::write(&p0, f).unwrap();
        let p1 = file_path(&dir, key(1));
        let f = fs::read(&p1).unwrap();
        fs::write(&p1, &f[..f.len() - 1]).unwrap();
        fs::remove_file(file_path(&dir, key(2))).unwrap();
        for e in 0..3 {
            assert!(!s.ready(key(e)), "entry {e} must be a miss");
        }
        assert_eq!(s.stats().disk_read_errors, 3);
        assert_eq!(
            s.take(key(3)).unwrap(),
            block(3, 64),
            "the intact block still restores"
        );
    }

    #[test]
    fn a_swapped_file_is_a_miss() {
        let root = tempfile::tempdir().unwrap();
        let cfg = TierConfig::host(1).with_disk(root.path(), 8);
        let mut s = KvTierStore::new(&cfg, 1).unwrap();
        for e in 0..3 {
            s.put(key(e), block(e as u8, 64));
        }
        let dir = s.disk_dir().unwrap().to_path_buf();
        fs::copy(file_path(&dir, key(1)), file_path(&dir, key(0))).unwrap();
        assert!(!s.ready(key(0)), "another block's file under this name");
        assert!(s.ready(key(1)));
    }

    #[test]
    fn an_unwritable_directory_is_a_clear_error() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("not-a-dir");
        fs::write(&file, b"x").unwrap();
        let cfg = TierConfig::host(1).with_disk(&file, 8);
        let err = KvTierStore::new(&cfg, 1).unwrap_err().to_string();
        assert!(err.contains("writable directory"), "{err}");
        let no_dir = TierConfig {
            disk_dir: None,
            ..TierConfig::host(1).with_disk(root.path(), 8)
        };
        assert!(KvTierStore::new(&no_dir, 1).is_err());
    }

    #[test]
    fn a_failed_write_loses_the_block_cleanly() {
        let root = tempfile::tempdir().unwrap();
        let cfg = TierConfig::host(1).with_disk(root.path(), 8);
        let mut s = KvTierStore::new(&cfg, 1).unwrap();
        let dir = s.disk_dir().unwrap().to_path_buf();
        s.put(key(0), block(0, 64));
        // The run's directory disappears (unmounted, cleaned by someone else).
        fs::remove_dir_all(&dir).unwrap();
        let lost = s.put(key(1), block(1, 64));
        assert_eq!(lost, vec![key(0)]);
        assert_eq!(s.stats().disk_write_errors, 1);
        assert!(!s.contains(key(0)));
        assert_eq!(s.take(key(1)).unwrap(), block(1, 64));
    }

    #[test]
    fn the_run_directory_is_removed_at_the_end() {
        let root = tempfile::tempdir().unwrap();
        let cfg = TierConfig::host(0).with_disk(root.path(), 8);
        let mut s = KvTierStore::new(&cfg, 1).unwrap();
        s.put(key(0), block(0, 8));
        let dir = s.disk_dir().unwrap().to_path_buf();
        assert!(dir.exists());
        drop(s);
        assert!(!dir.exists());
    }
}
