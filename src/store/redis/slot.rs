//! Redis Cluster hash slots (CRC16/XMODEM of the key or its `{hash tag}`, modulo 16384), so
//! that one request's counters can be grouped into one script call per slot.

/// Number of slots in a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The slot Redis Cluster assigns to `key`.
pub fn slot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) % SLOTS
}

/// The part of the key that is hashed: the first non-empty `{...}`, else the whole key.
fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// A hash tag that lands in `slot` (the same for every call): for a key a script must reach
/// beside the keys of that slot, such as the lease epoch's.
pub fn tag_for(slot: u16) -> &'static str {
    static TAGS: std::sync::LazyLock<Vec<String>> = std::sync::LazyLock::new(|| {
        // Numbers in order until every slot has one: about 170,000 tries, a few ms, once.
        let mut tags = vec![String::new(); usize::from(SLOTS)];
        let mut missing = usize::from(SLOTS);
        let mut n: u64 = 0;
        while missing > 0 {
            let tag = n.to_string();
            let s = usize::from(crc16(tag.as_bytes()) % SLOTS);
            if tags[s].is_empty() {
                tags[s] = tag;
                missing -= 1;
            }
            n += 1;
        }
        tags
    });
    &TAGS[usize::from(slot % SLOTS)]
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_slot_has_a_tag_that_lands_in_it() {
        for s in [0, 1, 5_000, SLOTS - 1] {
            let key = format!("prefix_sluice_epoch{{{}}}", tag_for(s));
            assert_eq!(slot(key.as_bytes()), s);
        }
    }

    #[test]
    fn slots_match_redis_cluster() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"{user1000}.followers"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_eq!(slot(b"{}x"), crc16(b"{}x") % SLOTS);
    }
}
