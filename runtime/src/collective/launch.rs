//! Jobs of one process per GPU, started the way `torchrun` starts them: each process learns its
//! place from the environment (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//! `MASTER_PORT`), and the processes meet once over TCP at rank 0's address ([`HostLink`]).
//!
//! The link carries what NCCL does not: NCCL's unique id from rank 0 to the others (before any
//! communicator exists), whether every rank loaded (so none waits in a collective for a rank
//! that failed), and each step's per-rank scalars (the loss of each rank's shard), averaged so
//! every process reports the loss of the union. Gradients never cross it: they go over NCCL,
//! inside the step.
//!
//! Rank 0 listens on `INGOT_RDZV_PORT`, or `MASTER_PORT + 1` where that is not set: torchrun's
//! own store may hold `MASTER_PORT` itself.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// Where this process stands in the job, from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchEnv {
    pub rank: usize,
    pub world: usize,
    /// The GPU of this host the process drives.
    pub local_rank: usize,
    pub master_addr: String,
    /// The port rank 0 listens on for the others ([`HostLink`]).
    pub port: u16,
}

impl LaunchEnv {
    /// Reads the variables torchrun sets; the error names each one missing or malformed.
    pub fn from_env() -> Result<LaunchEnv, String> {
        LaunchEnv::from_lookup(|k| std::env::var(k).ok())
    }

    /// As [`LaunchEnv::from_env`], from any lookup (tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<LaunchEnv, String> {
        let need = |k: &str| {
            get(k).ok_or_else(|| {
                format!(
                    "{k} is not set: --torchrun runs one rank of a job whose launcher (torchrun, \
                     or anything setting RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and \
                     MASTER_PORT) sets it"
                )
            })
        };
        let number = |k: &str| -> Result<usize, String> {
            let v = need(k)?;
            v.trim()
                .parse()
                .map_err(|_| format!("{k}={v:?} is not a number"))
        };
        let (rank, world) = (number("RANK")?, number("WORLD_SIZE")?);
        let local_rank = match get("LOCAL_RANK") {
            Some(_) => number("LOCAL_RANK")?,
            None => rank,
        };
        if world == 0 || rank >= world {
            return Err(format!("RANK={rank} is not a rank of WORLD_SIZE={world}"));
        }
        let master_addr = need("MASTER_ADDR")?;
        let port = match get("INGOT_RDZV_PORT") {
            Some(p) => p
                .trim()
                .parse::<u16>()
                .map_err(|_| format!("INGOT_RDZV_PORT={p:?} is not a port number"))?,
            None => {
                let m = number("MASTER_PORT")?;
                u16::try_from(m + 1).map_err(|_| {
                    format!("MASTER_PORT={m}: the port after it (Ingot's) is not a port; set INGOT_RDZV_PORT")
                })?
            }
        };
        Ok(LaunchEnv {
            rank,
            world,
            local_rank,
            master_addr,
            port,
        })
    }
}

/// The processes' TCP link: rank 0 holds one stream to each other rank, the others one to
/// rank 0. Every exchange is collective (every rank calls it, in the same order).
pub struct HostLink {
    rank: usize,
    world: usize,
    /// Rank 0: the streams of ranks 1..world, in rank order. Other ranks: rank 0's.
    peers: Vec<TcpStream>,
}

const HELLO: &[u8; 8] = b"ingot-r1";

fn io(what: &str) -> impl FnOnce(std::io::Error) -> String + '_ {
    move |e| format!("{what}: {e}")
}

impl HostLink {
    /// Meets the other ranks: rank 0 listens at `MASTER_ADDR:port` and sends `payload` (NCCL's
    /// unique id; made only on rank 0, so `make_payload` runs there alone) to each rank that
    /// connects; the others connect, retrying until `timeout`, and receive it. Returns the link
    /// and the payload.
    pub fn meet(
        env: &LaunchEnv,
        make_payload: impl FnOnce() -> Result<Vec<u8>, String>,
        timeout: Duration,
    ) -> Result<(HostLink, Vec<u8>), String> {
        let addr = (env.master_addr.as_str(), env.port);
        if env.world == 1 {
            let payload = make_payload()?;
            return Ok((HostLink::alone(), payload));
        }
        if env.rank == 0 {
            let listener = TcpListener::bind(addr).map_err(io(&format!(
                "rank 0 listening at {}:{} (set INGOT_RDZV_PORT to another port if it is taken)",
                env.master_addr, env.port
            )))?;
            let payload = make_payload()?;
            listener
                .set_nonblocking(true)
                .map_err(io("setting up the listener"))?;
            let mut slots: Vec<Option<TcpStream>> = (1..env.world).map(|_| None).collect();
            let start = Instant::now();
            while slots.iter().any(Option::is_none) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        s.set_nonblocking(false).map_err(io("accepting a rank"))?;
                        s.set_read_timeout(Some(timeout))
                            .map_err(io("accepting a rank"))?;
                        let mut hello = [0u8; 16];
                        s.read_exact(&mut hello)
                            .map_err(io("reading a rank's hello"))?;
                        if &hello[..8] != HELLO {
                            return Err(format!(
                                "a connection to {}:{} is not an Ingot rank of this job",
                                env.master_addr, env.port
                            ));
                        }
                        let r =
                            u32::from_le_bytes(hello[8..12].try_into().expect("4 bytes")) as usize;
                        let w =
                            u32::from_le_bytes(hello[12..16].try_into().expect("4 bytes")) as usize;
                        if w != env.world || r == 0 || r >= env.world {
                            return Err(format!(
                                "a process says it is rank {r} of {w}; this job has {} ranks",
                                env.world
                            ));
                        }
                        if slots[r - 1].is_some() {
                            return Err(format!("two processes say they are rank {r}"));
                        }
                        s.write_all(&(payload.len() as u32).to_le_bytes())
                            .and_then(|_| s.write_all(&payload))
                            .map_err(io("sending the id"))?;
                        s.set_nodelay(true).map_err(io("setting up a link"))?;
                        s.set_read_timeout(None).map_err(io("setting up a link"))?;
                        slots[r - 1] = Some(s);
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if start.elapsed() > timeout {
                            let missing: Vec<usize> = slots
                                .iter()
                                .enumerate()
                                .filter(|(_, s)| s.is_none())
                                .map(|(i, _)| i + 1)
                                .collect();
                            return Err(format!(
                                "rank 0 waited {:.0} s at {}:{} for ranks {missing:?}, which never connected",
                                timeout.as_secs_f64(),
                                env.master_addr,
                                env.port
                            ));
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(e) => return Err(io("accepting a rank")(e)),
                }
            }
            let peers = slots
                .into_iter()
                .map(|s| s.expect("all connected"))
                .collect();
            return Ok((
                HostLink {
                    rank: 0,
                    world: env.world,
                    peers,
                },
                payload,
            ));
        }
        let start = Instant::now();
        let mut s = loop {
            let target = addr
                .to_socket_addrs()
                .map_err(io(&format!("resolving MASTER_ADDR={}", env.master_addr)))?
                .next()
                .ok_or_else(|| format!("MASTER_ADDR={} resolves to nothing", env.master_addr))?;
            match TcpStream::connect_timeout(&target, Duration::from_secs(5)) {
                Ok(s) => break s,
                Err(e) if start.elapsed() > timeout => {
                    return Err(format!(
                        "rank {} could not reach rank 0 at {}:{} in {:.0} s: {e}",
                        env.rank,
                        env.master_addr,
                        env.port,
                        timeout.as_secs_f64()
                    ))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        };
        s.set_read_timeout(Some(timeout))
            .map_err(io("connecting to rank 0"))?;
        let mut hello = HELLO.to_vec();
        hello.extend_from_slice(&(env.rank as u32).to_le_bytes());
        hello.extend_from_slice(&(env.world as u32).to_le_bytes());
        s.write_all(&hello).map_err(io("greeting rank 0"))?;
        let mut len = [0u8; 4];
        s.read_exact(&mut len)
            .map_err(io("receiving the id from rank 0"))?;
        let mut payload = vec![0u8; u32::from_le_bytes(len) as usize];
        s.read_exact(&mut payload)
            .map_err(io("receiving the id from rank 0"))?;
        s.set_nodelay(true).map_err(io("setting up a link"))?;
        s.set_read_timeout(None).map_err(io("setting up a link"))?;
        Ok((
            HostLink {
                rank: env.rank,
                world: env.world,
                peers: vec![s],
            },
            payload,
        ))
    }

    /// The link of a job of one rank: every exchange returns this rank's own value.
    pub fn alone() -> HostLink {
        HostLink {
            rank: 0,
            world: 1,
            peers: Vec::new(),
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// Every rank's 8 bytes, in rank order, on every rank.
    fn all_gather(&mut self, mine: [u8; 8]) -> Result<Vec<[u8; 8]>, String> {
        if self.world == 1 {
            return Ok(vec![mine]);
        }
        let lost = |r: usize| io_lost(r);
        if self.rank == 0 {
            let mut all = vec![mine];
            for (i, s) in self.peers.iter_mut().enumerate() {
                let mut v = [0u8; 8];
                s.read_exact(&mut v).map_err(lost(i + 1))?;
                all.push(v);
            }
            let bytes: Vec<u8> = all.iter().flatten().copied().collect();
            for (i, s) in self.peers.iter_mut().enumerate() {
                s.write_all(&bytes).map_err(lost(i + 1))?;
            }
            Ok(all)
        } else {
            let s = &mut self.peers[0];
            s.write_all(&mine).map_err(lost(0))?;
            let mut bytes = vec![0u8; 8 * self.world];
            s.read_exact(&mut bytes).map_err(lost(0))?;
            Ok(bytes
                .chunks_exact(8)
                .map(|c| c.try_into().expect("8 bytes"))
                .collect())
        }
    }

    /// Every rank's value, in rank order.
    pub fn all_gather_f64(&mut self, v: f64) -> Result<Vec<f64>, String> {
        Ok(self
            .all_gather(v.to_le_bytes())?
            .into_iter()
            .map(f64::from_le_bytes)
            .collect())
    }

    /// Whether every rank passed `ok` (false on every rank if the link broke).
    pub fn all_ok(&mut self, ok: bool) -> bool {
        let mine = [ok as u8, 0, 0, 0, 0, 0, 0, 0];
        self.all_gather(mine)
            .map(|all| all.iter().all(|v| v[0] == 1))
            .unwrap_or(false)
    }
}

fn io_lost(r: usize) -> impl FnOnce(std::io::Error) -> String {
    move |e| format!("the link to rank {r} broke (did that process fail?): {e}")
}

/// The value of a scalar every rank holds: the same bits on every rank (read after an
/// all-reduce) stay as they are; otherwise (each rank's own shard's mean loss) their mean,
/// which for equal shards of a mean loss is the union's.
pub fn mean_of_ranks(values: &[f64]) -> f64 {
    if values.iter().all(|v| v.to_bits() == values[0].to_bits()) {
        return values[0];
    }
    values.iter().sum::<f64>() / values.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(vars: &[(&str, &str)]) -> Result<LaunchEnv, String> {
        let m: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        LaunchEnv::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn the_launch_environment_is_read_as_torchrun_sets_it_and_each_gap_is_named() {
        let ok = env(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", "29500"),
        ])
        .unwrap();
        assert_eq!(
            (ok.rank, ok.world, ok.local_rank, ok.port),
            (1, 2, 1, 29501)
        );
        let e = env(&[("RANK", "0"), ("MASTER_ADDR", "h"), ("MASTER_PORT", "1")]).unwrap_err();
        assert!(e.contains("WORLD_SIZE is not set"), "{e}");
        let e = env(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ])
        .unwrap_err();
        assert!(e.contains("RANK=2 is not a rank of WORLD_SIZE=2"), "{e}");
        let e = env(&[
            ("RANK", "x"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ])
        .unwrap_err();
        assert!(e.contains("RANK=\"x\" is not a number"), "{e}");
        let p = env(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "1"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "65535"),
            ("INGOT_RDZV_PORT", "4000"),
        ])
        .unwrap();
        assert_eq!((p.port, p.local_rank), (4000, 0));
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    fn launch(rank: usize, world: usize, port: u16) -> LaunchEnv {
        LaunchEnv {
            rank,
            world,
            local_rank: rank,
            master_addr: "127.0.0.1".into(),
            port,
        }
    }

    #[test]
    fn three_processes_meet_get_rank_0s_id_and_average_their_scalars() {
        let port = free_port();
        let handles: Vec<_> = (0..3)
            .map(|r| {
                std::thread::spawn(move || {
                    let (mut link, id) = HostLink::meet(
                        &launch(r, 3, port),
                        || {
                            assert_eq!(r, 0, "only rank 0 makes the id");
                            Ok(b"the unique id".to_vec())
                        },
                        Duration::from_secs(20),
                    )
                    .unwrap();
                    let all = link.all_gather_f64(r as f64 + 0.5).unwrap();
                    let same = link.all_gather_f64(7.25).unwrap();
                    let ok = link.all_ok(r != 2);
                    (id, all, mean_of_ranks(&same), ok)
                })
            })
            .collect();
        for h in handles {
            let (id, all, same, ok) = h.join().unwrap();
            assert_eq!(id, b"the unique id");
            assert_eq!(all, vec![0.5, 1.5, 2.5]);
            assert_eq!(mean_of_ranks(&all), 1.5);
            assert_eq!(same, 7.25);
            assert!(!ok, "rank 2 failed, so no rank goes on");
        }
    }

    #[test]
    fn rank_0_gives_up_naming_the_ranks_that_never_came() {
        let port = free_port();
        let e = match HostLink::meet(
            &launch(0, 3, port),
            || Ok(vec![1]),
            Duration::from_millis(300),
        ) {
            Err(e) => e,
            Ok(_) => panic!("no other rank exists"),
        };
        assert!(e.contains("ranks [1, 2], which never connected"), "{e}");
    }
}
