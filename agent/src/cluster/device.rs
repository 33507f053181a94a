//! What a block device completed since it appeared: the kernel's
//! `/sys/block/<name>/stat` (the same file as `/sys/dev/block/<maj:min>/stat`;
//! Documentation/block/stat.rst). The one reader of it: exact device bytes
//! (read-write, fio), the combined I/O budget's split, and the I/Os a
//! sampled cell's cluster made.

use std::path::Path;

/// Cumulative counters of one block device. Requests are counted after
/// the block layer merged adjacent bios; `flushes` are cache flushes (what
/// an fsync asks of the device), counted apart from writes (Linux 5.5+; 0
/// before).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeviceStat {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
}

impl DeviceStat {
    /// Reads a device's stat file; None when it is not there (the device
    /// is gone) or not in the kernel's format.
    pub fn read(stat_file: &Path) -> Option<DeviceStat> {
        parse(&std::fs::read_to_string(stat_file).ok()?)
    }

    /// The device `major:minor`'s counters.
    pub fn of(dev: &str) -> Option<DeviceStat> {
        DeviceStat::read(Path::new(&format!("/sys/dev/block/{dev}/stat")))
    }
}

/// The stat file's fields: reads, reads merged, sectors read, ms reading,
/// writes, writes merged, sectors written, …, and from Linux 5.5 the 16th
/// is flushes. Sectors are 512 bytes whatever the device's block size.
fn parse(text: &str) -> Option<DeviceStat> {
    let f: Vec<u64> = text
        .split_whitespace()
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    Some(DeviceStat {
        reads: *f.first()?,
        read_bytes: f.get(2)? * 512,
        writes: *f.get(4)?,
        write_bytes: f.get(6)? * 512,
        flushes: f.get(15).copied().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernels_stat_file_is_read_by_position() {
        // A 6.x kernel's 17 fields.
        let s = parse(
            "   45438     5813  1690546     5681     8861     3133  1562576     4856        0     4572    10751      803        0   294128      112     1660      100\n",
        )
        .unwrap();
        assert_eq!(
            s,
            DeviceStat {
                reads: 45438,
                read_bytes: 1690546 * 512,
                writes: 8861,
                write_bytes: 1562576 * 512,
                flushes: 1660,
            }
        );
        // A 4.x kernel's 11 fields: no flushes counted.
        let old = parse("1 0 8 0 2 0 16 0 0 0 0").unwrap();
        assert_eq!((old.reads, old.writes, old.flushes), (1, 2, 0));
        assert_eq!(old.write_bytes, 16 * 512);
        assert_eq!(parse("1 0"), None);
        assert_eq!(parse("not a stat file"), None);
    }
}
