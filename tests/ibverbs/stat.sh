# `uroce stat` against an unmodified program on uroce's libibverbs.so.1.
# Sourced by matrix.sh, whose pass, fail, $tmp, $root and LD_LIBRARY_PATH
# it uses; its results count in matrix.sh's closing line.
#
#   * ibv_rc_pingpong's server, waiting for its client: `uroce stat PID
#     --json` shows its device, its RC QP in INIT with the 500 receives
#     it posted and its 4096-byte buffer registered; once the client ran,
#     the server exits and its state socket is gone with it.
#
# Its own addresses (127.119.200.1 and .2) and TCP port (21400).

stat_uroce=${stat_uroce:-$root/target/release/uroce}

stat_pingpong() {
  local name="uroce stat: ibv_rc_pingpong"
  local s=127.119.200.1 c=127.119.200.2 port=21400
  # exec: $! is the program itself, the PID uroce stat is asked for.
  (UROCE_DEVICES=uroce0=$s exec ibv_rc_pingpong -d uroce0 -g 0 -p $port -n 200 >"$tmp/server" 2>&1) &
  local spid=$!
  for _ in $(seq 100); do
    ss -Hltn "sport = :$port" | grep -q . && break
    sleep 0.1
  done
  env -u LD_LIBRARY_PATH "$stat_uroce" stat "$spid" --json >"$tmp/stat.json" 2>"$tmp/out"
  local line
  line=$(/usr/bin/python3 - "$tmp/stat.json" 2>>"$tmp/out" <<'PY'
import json, sys
procs = json.load(open(sys.argv[1]))
assert len(procs) == 1, procs
p = procs[0]
assert p["comm"] == "ibv_rc_pingpong", p["comm"]
d = p["devices"][0]
assert (d["name"], d["addr"]) == ("uroce0", "127.119.200.1"), d
q = d["qps"][0]
assert (q["qp_type"], q["state"], q["rq_wrs"]) == ("RC", "INIT", 500), q
assert [m["length"] for m in d["mrs"]] == [4096], d["mrs"]
print(f"qp {q['qpn']:#08x} {q['state']} rq-wrs {q['rq_wrs']}/{q['max_recv_wr']}, mr 4096")
PY
  )
  local ok=$?
  UROCE_DEVICES=uroce1=$c timeout 60 ibv_rc_pingpong -d uroce1 -g 0 -p $port -n 200 $s >"$tmp/client" 2>&1
  local crc=$?
  wait "$spid"
  local src=$?
  # Gone with its process: asking for it fails.
  local gone=0
  env -u LD_LIBRARY_PATH "$stat_uroce" stat "$spid" >/dev/null 2>&1 || gone=1
  cat "$tmp/client" "$tmp/server" >>"$tmp/out"
  if [ $ok = 0 ] && [ $crc = 0 ] && [ $src = 0 ] && [ $gone = 1 ]; then
    pass "$name" "$line"
  else
    fail "$name" "state checked $ok, client exit $crc, server exit $src, socket gone $gone"
  fi
}
stat_pingpong
