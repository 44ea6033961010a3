//! One call of a loaded Lua script: `EVALSHA sha numkeys key… arg…`,
//! written straight into one command buffer.
//!
//! The redis crate's `ScriptInvocation` keeps every key and argument in a
//! buffer of its own and copies them all into a new `EVALSHA` command at
//! each call: 15,800 instructions of a Redis `lease` claim's 134,000 (their
//! allocations, conversions, freeing and the copy; docs/BENCHMARKS.md,
//! round 8). Here the number of keys is declared first, then the keys and
//! the arguments are written as they come.

use ::redis::aio::ConnectionLike;
use ::redis::{Cmd, ErrorKind, RedisResult, Script, ServerErrorKind, ToRedisArgs, Value};

/// Loads of the script that one call makes on `NOSCRIPT`, at most.
const LOADS: u32 = 4;

pub(crate) struct ScriptCall<'a> {
    script: &'a Script,
    cmd: Cmd,
    /// Keys declared but not written yet.
    keys_left: usize,
    /// A key beyond the declared number, or an argument before the last
    /// key, was written: the call would hand the script shifted `KEYS` and
    /// `ARGV`, so it is refused unsent.
    misbuilt: bool,
}

impl<'a> ScriptCall<'a> {
    /// A call of `script` with `keys` keys, to be written next with
    /// [`key`](Self::key), before any [`arg`](Self::arg).
    pub(crate) fn new(script: &'a Script, keys: usize) -> Self {
        let mut cmd = Cmd::with_capacity(3 + keys + 24, 512);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        ScriptCall {
            script,
            cmd,
            keys_left: keys,
            misbuilt: false,
        }
    }

    /// The next declared key (one string).
    pub(crate) fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        debug_assert!(self.keys_left > 0, "a key beyond the declared number");
        match self.keys_left.checked_sub(1) {
            Some(left) => self.keys_left = left,
            None => self.misbuilt = true,
        }
        self.cmd.arg(key);
        self
    }

    /// The next argument (`ARGV[i]`), once every key is written.
    pub(crate) fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        debug_assert_eq!(self.keys_left, 0, "an argument before the declared keys");
        self.misbuilt |= self.keys_left != 0;
        self.cmd.arg(arg);
        self
    }

    /// Sends the call. On `NOSCRIPT` (a restart, failover or `SCRIPT FLUSH`
    /// since the load) it loads the script on `con` and sends the call
    /// again, up to [`LOADS`] times: a flush between a load and the resend
    /// answers `NOSCRIPT` again. A script that answered `NOSCRIPT` never
    /// ran, so the resend is safe. A call whose keys do not match the
    /// declared number is refused unsent.
    pub(crate) async fn invoke_async(&self, con: &mut impl ConnectionLike) -> RedisResult<Value> {
        if self.misbuilt || self.keys_left != 0 {
            return Err((
                ErrorKind::Client,
                "a script call whose keys do not match the number it declared",
            )
                .into());
        }
        let mut loads = 0;
        loop {
            match self.cmd.query_async(con).await {
                Err(e)
                    if loads < LOADS
                        && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) =>
                {
                    loads += 1;
                    self.script.load_async(con).await?;
                }
                res => return res,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(c: &ScriptCall<'_>) -> Vec<Vec<u8>> {
        c.cmd
            .args_iter()
            .map(|a| match a {
                ::redis::Arg::Simple(b) => b.to_vec(),
                _ => b"<not a plain argument>".to_vec(),
            })
            .collect()
    }

    #[test]
    fn keys_then_arguments_after_the_sha_and_their_number() {
        let script = Script::new("return 1");
        let mut c = ScriptCall::new(&script, 2);
        c.key("k1")
            .key(String::from("k2"))
            .arg("claim")
            .arg(-5i64)
            .arg(7u64);
        let want: Vec<Vec<u8>> = vec![
            b"EVALSHA".to_vec(),
            script.get_hash().as_bytes().to_vec(),
            b"2".to_vec(),
            b"k1".to_vec(),
            b"k2".to_vec(),
            b"claim".to_vec(),
            b"-5".to_vec(),
            b"7".to_vec(),
        ];
        assert_eq!(args(&c), want);
    }

    /// A connection that answers from a script of replies and records the
    /// command names it was sent.
    struct Scripted {
        replies: Vec<RedisResult<Value>>,
        sent: Vec<String>,
    }

    impl ConnectionLike for Scripted {
        fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> ::redis::RedisFuture<'a, Value> {
            let name = match cmd.args_iter().next() {
                Some(::redis::Arg::Simple(b)) => String::from_utf8_lossy(b).into_owned(),
                _ => String::new(),
            };
            self.sent.push(name);
            let reply = if self.replies.is_empty() {
                Err((ErrorKind::Client, "no reply left").into())
            } else {
                self.replies.remove(0)
            };
            Box::pin(async move { reply })
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            _: &'a ::redis::Pipeline,
            _: usize,
            _: usize,
        ) -> ::redis::RedisFuture<'a, Vec<Value>> {
            Box::pin(async { Err((ErrorKind::Client, "no pipelines here").into()) })
        }

        fn get_db(&self) -> i64 {
            0
        }
    }

    fn no_script() -> RedisResult<Value> {
        Err(::redis::RedisError::from((
            ErrorKind::Server(ServerErrorKind::NoScript),
            "NOSCRIPT",
        )))
    }

    /// `NOSCRIPT`: the script is loaded on the same connection and the call
    /// sent again, up to `LOADS` times; then the `NOSCRIPT` is the answer.
    #[tokio::test]
    async fn noscript_loads_the_script_and_sends_the_call_again() {
        let script = Script::new("return 1");
        let mut c = ScriptCall::new(&script, 1);
        c.key("k").arg(1);
        let hash = Value::BulkString(script.get_hash().as_bytes().to_vec());
        let mut con = Scripted {
            replies: vec![no_script(), Ok(hash.clone()), Ok(Value::Int(7))],
            sent: vec![],
        };
        assert_eq!(c.invoke_async(&mut con).await.unwrap(), Value::Int(7));
        assert_eq!(con.sent, ["EVALSHA", "SCRIPT", "EVALSHA"]);
        // Flushed again after every load: LOADS loads, then the error.
        let mut replies = vec![no_script()];
        for _ in 0..LOADS {
            replies.extend([Ok(hash.clone()), no_script()]);
        }
        let mut con = Scripted {
            replies,
            sent: vec![],
        };
        let e = c.invoke_async(&mut con).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Server(ServerErrorKind::NoScript));
        assert_eq!(con.sent.len(), 1 + 2 * LOADS as usize, "{:?}", con.sent);
        assert!(con.replies.is_empty());
    }

    /// Keys short of the declared number: refused, nothing sent (beyond it,
    /// a debug build stops at the `debug_assert`).
    #[tokio::test]
    async fn a_call_whose_keys_do_not_match_is_refused_unsent() {
        let script = Script::new("return 1");
        let mut short = ScriptCall::new(&script, 2);
        short.key("k1");
        let mut con = Scripted {
            replies: vec![Ok(Value::Int(1))],
            sent: vec![],
        };
        let e = short.invoke_async(&mut con).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Client);
        assert!(con.sent.is_empty(), "{:?}", con.sent);
    }
}
