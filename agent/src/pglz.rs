//! PostgreSQL's pglz compressor (src/common/pg_lzcompress.c) with its
//! default strategy, re-expressed in Rust so the compression analysis can
//! say what PostgreSQL would store without a server round trip per page.
//! The output is byte for byte PostgreSQL's (checked in
//! `agent/tests/compression.rs` against values a real server compressed).
//!
//! The format: a control byte announces 8 items; a clear bit is one literal
//! byte, a set bit a back reference of 2 bytes (length 3–17, offset up to
//! 4,095) or 3 (length 18–273). Matches are found through a hash of the next
//! 4 bytes into lists of the last 4,096 positions, newest first; the search
//! stops at a match of `good_match` bytes, a threshold lowered by 10 % per
//! entry visited. The default strategy gives up on inputs under 32 bytes,
//! when nothing matched within the first 1,024 output bytes, or when the
//! output would not be at least 25 % smaller than the input.

/// The default strategy (PGLZ_strategy_default).
const MIN_INPUT_SIZE: usize = 32;
const MIN_COMP_RATE: usize = 25;
const FIRST_SUCCESS_BY: usize = 1024;
const MATCH_SIZE_GOOD: i32 = 128;
const MATCH_SIZE_DROP: i32 = 10;

const HISTORY_SIZE: usize = 4096;
const MAX_MATCH: usize = 273;
const MAX_OFFSET: usize = 0x0fff;
/// Entry 0 of the history means "none".
const NONE: u16 = 0;

#[derive(Clone, Copy, Default)]
struct Entry {
    next: u16,
    /// 0 = head of its list.
    prev: u16,
    hindex: u16,
    pos: usize,
}

/// The history: per hash slot the newest entry, entries in a ring of 4,096
/// (entry 0 unused) linked newest to oldest.
struct History {
    start: Vec<u16>,
    entries: Vec<Entry>,
    next: usize,
    recycle: bool,
    mask: usize,
}

impl History {
    fn new(input_len: usize) -> History {
        let size = match input_len {
            0..128 => 512,
            128..256 => 1024,
            256..512 => 2048,
            512..1024 => 4096,
            _ => 8192,
        };
        History {
            start: vec![NONE; size],
            entries: vec![Entry::default(); HISTORY_SIZE + 1],
            next: 1,
            recycle: false,
            mask: size - 1,
        }
    }

    /// The slot of the 4 bytes at `pos` (the first byte alone near the end).
    /// PostgreSQL computes it on `char`, signed on the hosts it is built
    /// for here (x86-64), and the sign reaches the masked bits: so do we.
    fn index(&self, input: &[u8], pos: usize) -> usize {
        let s = |i: usize| input[pos + i] as i8 as i32;
        let h = if input.len() - pos < 4 {
            s(0)
        } else {
            (s(0) << 6) ^ (s(1) << 4) ^ (s(2) << 2) ^ s(3)
        };
        (h as usize) & self.mask
    }

    fn add(&mut self, input: &[u8], pos: usize) {
        let hindex = self.index(input, pos);
        let me = self.next;
        if self.recycle {
            // Unlink the entry being reused from its old list.
            let old = self.entries[me];
            if old.prev == NONE {
                self.start[old.hindex as usize] = old.next;
            } else {
                self.entries[old.prev as usize].next = old.next;
            }
            self.entries[old.next as usize].prev = old.prev;
        }
        let head = self.start[hindex];
        self.entries[me] = Entry {
            next: head,
            prev: NONE,
            hindex: hindex as u16,
            pos,
        };
        // Entry 0 stands for "none": writing its prev is harmless.
        self.entries[head as usize].prev = me as u16;
        self.start[hindex] = me as u16;
        self.next += 1;
        if self.next > HISTORY_SIZE {
            self.next = 1;
            self.recycle = true;
        }
    }

    /// The longest earlier match for the bytes at `pos`: (length, offset),
    /// when it is longer than 2 bytes.
    fn find(&self, input: &[u8], pos: usize) -> Option<(usize, usize)> {
        let end = input.len();
        let mut good = MATCH_SIZE_GOOD;
        let (mut len, mut off) = (0usize, 0usize);
        let mut e = self.start[self.index(input, pos)];
        while e != NONE {
            let h = self.entries[e as usize].pos;
            let this_off = pos - h;
            if this_off >= MAX_OFFSET {
                break;
            }
            let mut this_len = 0;
            // Once a match of 16+ bytes is known, a candidate must at least
            // equal it before it is extended.
            if len >= 16 {
                if input[pos..pos + len] == input[h..h + len] {
                    this_len = len;
                    while pos + this_len < end
                        && input[pos + this_len] == input[h + this_len]
                        && this_len < MAX_MATCH
                    {
                        this_len += 1;
                    }
                }
            } else {
                while pos + this_len < end
                    && input[pos + this_len] == input[h + this_len]
                    && this_len < MAX_MATCH
                {
                    this_len += 1;
                }
            }
            if this_len > len {
                len = this_len;
                off = this_off;
            }
            e = self.entries[e as usize].next;
            if e != NONE {
                if len as i32 >= good {
                    break;
                }
                good -= good * MATCH_SIZE_DROP / 100;
            }
        }
        (len > 2).then_some((len, off))
    }
}

/// Compresses `input` as PostgreSQL's `pglz_compress` with the default
/// strategy: Some(compressed bytes), or None where PostgreSQL gives up and
/// stores the value raw.
pub fn compress(input: &[u8]) -> Option<Vec<u8>> {
    let slen = input.len();
    if slen < MIN_INPUT_SIZE || slen > i32::MAX as usize {
        return None;
    }
    let result_max = if slen > i32::MAX as usize / 100 {
        (slen / 100) * (100 - MIN_COMP_RATE)
    } else {
        slen * (100 - MIN_COMP_RATE) / 100
    };
    let mut hist = History::new(slen);
    let mut out: Vec<u8> = Vec::with_capacity(result_max + 4);
    // The control byte being filled, where it goes, and the next bit.
    let mut ctrl_at: Option<usize> = None;
    let mut ctrl_byte = 0u8;
    let mut ctrl_bit = 0u32;
    let mut found_match = false;
    let mut dp = 0;
    // Starts a new control byte when the current one is full.
    let next_item =
        |out: &mut Vec<u8>, ctrl_at: &mut Option<usize>, ctrl_byte: &mut u8, ctrl_bit: &mut u32| {
            if *ctrl_bit & 0xff == 0 {
                if let Some(at) = *ctrl_at {
                    out[at] = *ctrl_byte;
                }
                *ctrl_at = Some(out.len());
                out.push(0);
                *ctrl_byte = 0;
                *ctrl_bit = 1;
            }
        };
    while dp < slen {
        if out.len() >= result_max {
            return None;
        }
        if !found_match && out.len() >= FIRST_SUCCESS_BY {
            return None;
        }
        match hist.find(input, dp) {
            Some((len, off)) => {
                next_item(&mut out, &mut ctrl_at, &mut ctrl_byte, &mut ctrl_bit);
                ctrl_byte |= ctrl_bit as u8;
                ctrl_bit <<= 1;
                if len > 17 {
                    out.push((((off & 0xf00) >> 4) | 0x0f) as u8);
                    out.push((off & 0xff) as u8);
                    out.push((len - 18) as u8);
                } else {
                    out.push((((off & 0xf00) >> 4) | (len - 3)) as u8);
                    out.push((off & 0xff) as u8);
                }
                for _ in 0..len {
                    hist.add(input, dp);
                    dp += 1;
                }
                found_match = true;
            }
            None => {
                next_item(&mut out, &mut ctrl_at, &mut ctrl_byte, &mut ctrl_bit);
                out.push(input[dp]);
                ctrl_bit <<= 1;
                hist.add(input, dp);
                dp += 1;
            }
        }
    }
    if let Some(at) = ctrl_at {
        out[at] = ctrl_byte;
    }
    if out.len() >= result_max {
        return None;
    }
    Some(out)
}

/// Decompresses pglz output (for tests: compression must round-trip).
pub fn decompress(src: &[u8], raw_len: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(raw_len);
    let mut sp = 0;
    while sp < src.len() && out.len() < raw_len {
        let ctrl = src[sp];
        sp += 1;
        for bit in 0..8 {
            if sp >= src.len() || out.len() >= raw_len {
                break;
            }
            if ctrl >> bit & 1 == 1 {
                let b0 = *src.get(sp)? as usize;
                let b1 = *src.get(sp + 1)? as usize;
                sp += 2;
                let mut len = (b0 & 0x0f) + 3;
                let off = ((b0 & 0xf0) << 4) | b1;
                if len == 18 {
                    len += *src.get(sp)? as usize;
                    sp += 1;
                }
                if off == 0 || off > out.len() {
                    return None;
                }
                for _ in 0..len.min(raw_len - out.len()) {
                    out.push(out[out.len() - off]);
                }
            } else {
                out.push(src[sp]);
                sp += 1;
            }
        }
    }
    (out.len() == raw_len && sp == src.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_gives_up_like_postgres() {
        let zeros = vec![0u8; 8192];
        let c = compress(&zeros).unwrap();
        assert!(c.len() < 200, "{}", c.len());
        assert_eq!(decompress(&c, zeros.len()).unwrap(), zeros);
        // Too short, and incompressible: stored raw.
        assert_eq!(compress(b"short"), None);
        let mut x = 0x9E3779B97F4A7C15u64;
        let noise: Vec<u8> = (0..8192)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        assert_eq!(compress(&noise), None);
        let text: Vec<u8> = (0..20_000u32)
            .flat_map(|i| format!("row {i} value {} ", i % 97).into_bytes())
            .collect();
        let c = compress(&text).unwrap();
        assert!(c.len() < text.len() * 3 / 4);
        assert_eq!(decompress(&c, text.len()).unwrap(), text);
        // Bytes above 0x7f hash as signed chars: still round-trips.
        let high: Vec<u8> = (0..5000u32).map(|i| 0x80 | (i % 37) as u8).collect();
        let c = compress(&high).unwrap();
        assert_eq!(decompress(&c, high.len()).unwrap(), high);
    }
}
