#!/usr/bin/env bash
# A throwaway 3-node MariaDB Galera cluster on 127.0.0.1, for the Galera
# tests (make test-galera). Everything lives in one directory, removed by
# stop: $DSYNC_GALERA_DIR (missing or empty at start; make test-galera
# passes a fresh mktemp -d), by default ${TMPDIR:-/tmp}/dsync-galera. Nothing
# else is touched: no system service, no /etc/mysql (every server runs with
# --no-defaults), no /var/lib/mysql.
#
#   scripts/galera.sh start       install missing packages, start 3 nodes, wait until all are Synced
#   scripts/galera.sh stop        stop the processes start started and remove the directory
#   scripts/galera.sh kill N      SIGKILL node N (1-3), as a crash would
#   scripts/galera.sh restart N   start node N again on its datadir (it rejoins by IST or SST)
#   scripts/galera.sh status      each node's pid, port, cluster size and state; fails unless all Synced
#   scripts/galera.sh dsn N       print node N's go-sql-driver DSN, root@tcp(127.0.0.1:PORT)/
#
# Each node has its own datadir and four free loopback ports (SQL, group
# communication, IST, SST), chosen at start and kept across restarts. Node 1
# bootstraps the cluster; nodes 2 and 3 join it by rsync SST. root connects
# over TCP without a password. Packages (Debian's galera-4, mariadb-server,
# rsync) are installed with apt-get when missing. Note that installing
# mariadb-server on a machine without a policy-rc.d may start Debian's own
# mariadb service; this script never uses, stops or configures it.
#
# When run as root the servers run as the mysql user (--user=mysql): as root
# the joiner's rsync SST daemon would drop to nobody and could not write its
# datadir.
set -euo pipefail

NODES=3
DIR=${DSYNC_GALERA_DIR:-${TMPDIR:-/tmp}/dsync-galera}
MARKER=.dsync-galera # a file in DIR saying the directory is this script's
START_TIMEOUT=${DSYNC_GALERA_TIMEOUT:-180} # seconds a node may take to reach Synced

die() {
  echo "scripts/galera.sh: $*" >&2
  exit 1
}

say() { echo "scripts/galera.sh: $*" >&2; }

# find_bin prints the path of the first of its arguments found in PATH or
# an sbin directory (often missing from a non-root PATH).
find_bin() {
  local name dir
  for name in "$@"; do
    if command -v "$name" >/dev/null 2>&1; then
      command -v "$name"
      return 0
    fi
    for dir in /usr/sbin /usr/local/sbin /usr/bin; do
      if [ -x "$dir/$name" ]; then
        echo "$dir/$name"
        return 0
      fi
    done
  done
  return 1
}

# find_provider prints the path of the Galera provider library.
find_provider() {
  local p
  for p in /usr/lib/galera/libgalera_smm.so /usr/lib/libgalera_smm.so /usr/lib64/galera-4/libgalera_smm.so; do
    if [ -f "$p" ]; then
      echo "$p"
      return 0
    fi
  done
  if command -v dpkg >/dev/null 2>&1; then
    p=$(dpkg -L galera-4 2>/dev/null | grep '/libgalera_smm\.so$' | head -n 1 || true)
    if [ -n "$p" ] && [ -f "$p" ]; then
      echo "$p"
      return 0
    fi
  fi
  return 1
}

# install_packages installs galera-4, mariadb-server and rsync from Debian's packages
# when any piece the cluster needs is missing.
install_packages() {
  if find_provider >/dev/null && find_bin mariadbd mysqld >/dev/null &&
    find_bin mariadb-install-db mysql_install_db >/dev/null && find_bin mariadb mysql >/dev/null &&
    find_bin wsrep_sst_rsync >/dev/null && find_bin rsync >/dev/null &&
    find_bin ss lsof >/dev/null; then
    return 0
  fi
  local sudo=""
  if [ "$(id -u)" != 0 ]; then
    sudo="sudo"
  fi
  say "installing galera-4 mariadb-server rsync from Debian's packages"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    galera-4 mariadb-server rsync >/dev/null
  find_provider >/dev/null || die "galera-4 is installed but libgalera_smm.so was not found"
}

node_dir() { echo "$DIR/node$1"; }

# need_cluster fails unless start has set up a cluster in DIR.
need_cluster() {
  [ -f "$DIR/$MARKER" ] && [ -f "$(node_dir 1)/ports" ] ||
    die "no cluster in $DIR (run: scripts/galera.sh start)"
}

# check_node fails unless $1 is a node number.
check_node() {
  case "${1:-}" in
  1 | 2 | 3) ;;
  *) die "node must be 1, 2 or 3, not '${1:-}'" ;;
  esac
}

# port prints the port of kind $2 (sql, gcomm, ist, sst) of node $1.
port() {
  local f
  f="$(node_dir "$1")/ports"
  [ -f "$f" ] || die "no cluster in $DIR (run: scripts/galera.sh start)"
  sed -n "s/^$2=//p" "$f"
}

# used_ports prints the TCP ports in use on this machine, in any state, from
# /proc (no ss or netstat needed).
used_ports() {
  local f
  for f in /proc/net/tcp /proc/net/tcp6; do
    [ -r "$f" ] || continue
    awk 'NR > 1 { split($2, a, ":"); print a[2] }' "$f" | while read -r hex; do echo $((16#$hex)); done
  done
}

# pick_ports prints $1 distinct free TCP ports, below the kernel's ephemeral
# range so that no outgoing connection takes one before its server binds it.
pick_ports() {
  local want=$1 lo=20000 hi=32767 used picked="" n=0 p tries=0
  if [ -r /proc/sys/net/ipv4/ip_local_port_range ]; then
    read -r hi _ </proc/sys/net/ipv4/ip_local_port_range
    hi=$((hi - 1))
    if [ "$hi" -le $((lo + 1000)) ]; then
      lo=10000
    fi
  fi
  used=" $(used_ports | tr '\n' ' ') "
  while [ "$n" -lt "$want" ]; do
    tries=$((tries + 1))
    [ "$tries" -lt 10000 ] || die "no free ports between $lo and $hi"
    p=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo + 1)))
    case "$used$picked " in *" $p "*) continue ;; esac
    # A listener that /proc does not show (another network namespace view):
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      continue
    fi
    picked="$picked $p"
    n=$((n + 1))
  done
  echo "$picked"
}

# sql runs a statement as root on node $1 over TCP and prints the rows,
# tab-separated, without headers.
sql() {
  local client
  client=$(find_bin mariadb mysql) || die "mariadb client not found"
  "$client" --no-defaults --protocol=tcp -h 127.0.0.1 -P "$(port "$1" sql)" -u root \
    --connect-timeout=2 -N -B -e "$2"
}

# pid prints node $1's server pid if that process is running (and is the
# server started on this node's datadir); else it prints nothing and fails.
pid() {
  local f p cmdline
  f="$(node_dir "$1")/mariadbd.launched"
  [ -f "$f" ] || return 1
  p=$(cat "$f")
  [ -n "$p" ] && [ -r "/proc/$p/cmdline" ] || return 1
  cmdline=$(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null) || return 1
  case "$cmdline" in
  *" --datadir=$(node_dir "$1")/data "*) ;;
  *) return 1 ;;
  esac
  # A killed server that its parent has not reaped yet is a zombie: gone.
  [ "$(awk '{print $3}' "/proc/$p/stat" 2>/dev/null)" != Z ] || return 1
  echo "$p"
}

# log_tail prints the end of node $1's error log and of its stdout/stderr.
log_tail() {
  local d
  d=$(node_dir "$1")
  echo "---- node $1: last lines of $d/error.log ----" >&2
  tail -n 40 "$d/error.log" >&2 2>/dev/null || echo "(no error log)" >&2
  if [ -s "$d/mariadbd.out" ]; then
    echo "---- node $1: $d/mariadbd.out ----" >&2
    tail -n 10 "$d/mariadbd.out" >&2
  fi
}

# launch starts node $1's server in the background, detached from this
# shell; with $2 = bootstrap it starts a new cluster.
launch() {
  local n=$1 d mariadbd provider user_args=() bootstrap=() gcomm="" i
  d=$(node_dir "$n")
  mariadbd=$(find_bin mariadbd mysqld) || die "mariadbd not found"
  provider=$(find_provider) || die "Galera provider libgalera_smm.so not found (package galera-4)"
  if [ "$(id -u)" = 0 ]; then
    user_args=(--user=mysql)
  fi
  if [ "${2:-}" = bootstrap ]; then
    bootstrap=(--wsrep-new-cluster)
  fi
  for i in $(seq 1 "$NODES"); do
    gcomm="$gcomm${gcomm:+,}127.0.0.1:$(port "$i" gcomm)"
  done
  local g ist sst args p
  g=$(port "$n" gcomm)
  ist=$(port "$n" ist)
  sst=$(port "$n" sst)
  args=(
    --no-defaults
    --datadir="$d/data"
    --tmpdir="$d/tmp"
    --socket="$d/mariadbd.sock"
    --pid-file="$d/mariadbd.pid"
    --log-error="$d/error.log"
    --port="$(port "$n" sql)"
    --bind-address=127.0.0.1
    --skip-name-resolve
    "${user_args[@]}"
    --max-connections=500
    --innodb-buffer-pool-size=64M
    --binlog-format=ROW
    --default-storage-engine=InnoDB
    --innodb-autoinc-lock-mode=2
    --wsrep-on=ON
    --wsrep-provider="$provider"
    --wsrep-cluster-name="$(cat "$DIR/cluster-name")"
    --wsrep-cluster-address="gcomm://$gcomm"
    --wsrep-node-name="node$n"
    --wsrep-node-address="127.0.0.1:$g"
    --wsrep-node-incoming-address="127.0.0.1:$(port "$n" sql)"
    --wsrep-provider-options="base_host=127.0.0.1;base_port=$g;gmcast.listen_addr=tcp://127.0.0.1:$g;ist.recv_addr=127.0.0.1:$ist;gcache.size=64M"
    --wsrep-sst-method=rsync
    --wsrep-sst-receive-address="127.0.0.1:$sst"
    "${bootstrap[@]}"
  )
  setsid "$mariadbd" "${args[@]}" </dev/null >>"$d/mariadbd.out" 2>&1 &
  p=$!
  echo "$p" >"$d/mariadbd.launched"
  # Until the forked shell has exec'd the server, its command line is this
  # script's, and pid would say the node is not running.
  local end=$((SECONDS + 10))
  while [ -d "/proc/$p" ] && ! pid "$n" >/dev/null && [ "$SECONDS" -lt "$end" ]; do
    sleep 0.05
  done
}

# wait_synced waits until node $1 is Synced in a cluster of $2 nodes, or
# fails with the node's error log when it exits or times out.
wait_synced() {
  local n=$1 size=$2 end status got_size got_state
  end=$((SECONDS + START_TIMEOUT))
  while :; do
    if ! pid "$n" >/dev/null; then
      log_tail "$n"
      die "node $n exited while starting (see above; directory $DIR)"
    fi
    status=$(sql "$n" "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
      WHERE VARIABLE_NAME IN ('WSREP_CLUSTER_SIZE', 'WSREP_LOCAL_STATE_COMMENT')" 2>/dev/null || true)
    got_size=$(echo "$status" | awk '$1 == "WSREP_CLUSTER_SIZE" { print $2 }')
    got_state=$(echo "$status" | awk '$1 == "WSREP_LOCAL_STATE_COMMENT" { print $2 }')
    if [ "$got_size" = "$size" ] && [ "$got_state" = Synced ]; then
      return 0
    fi
    if [ "$SECONDS" -ge "$end" ]; then
      log_tail "$n"
      die "node $n not Synced in a cluster of $size after ${START_TIMEOUT}s (size '${got_size}', state '${got_state}'; directory $DIR)"
    fi
    sleep 0.2
  done
}

# wait_cluster waits until every node is Synced in a cluster of 3.
wait_cluster() {
  local n
  for n in $(seq 1 "$NODES"); do
    wait_synced "$n" "$NODES"
  done
}

# our_processes prints the pids of the servers and SST helpers this
# cluster started: mariadbd, rsync and wsrep_sst_* processes whose command
# line names a path under DIR (a helper of a killed server is no longer
# its child).
our_processes() {
  local f p comm cmdline
  for f in /proc/[0-9]*/cmdline; do
    p=${f#/proc/}
    p=${p%/cmdline}
    comm=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    case "$comm" in
    mariadbd | mysqld | rsync | wsrep_sst_*) ;;
    *) continue ;;
    esac
    cmdline=$(tr '\0' ' ' <"$f" 2>/dev/null) || continue
    case "$cmdline" in
    *"$DIR/"*) echo "$p" ;;
    esac
  done
}

# wait_gone waits up to $2 seconds for process $1 to end.
wait_gone() {
  local end=$((SECONDS + $2))
  while [ -d "/proc/$1" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; do
    [ "$SECONDS" -lt "$end" ] || return 1
    sleep 0.1
  done
}

cmd_start() {
  if [ -d "$DIR" ] && [ -z "$(ls -A "$DIR")" ]; then
    : # an empty directory, e.g. from mktemp -d: use it
  elif [ -e "$DIR" ]; then
    [ -f "$DIR/$MARKER" ] || die "$DIR exists and was not made by this script; remove it or set DSYNC_GALERA_DIR"
    local n
    for n in $(seq 1 "$NODES"); do
      if p=$(pid "$n"); then
        die "a cluster is already running in $DIR (node $n, pid $p); run: scripts/galera.sh stop"
      fi
    done
    say "removing the stale directory $DIR of a cluster that is no longer running"
    cmd_stop >/dev/null 2>&1 || true
  fi
  install_packages
  local installdb
  installdb=$(find_bin mariadb-install-db mysql_install_db) || die "mariadb-install-db not found"
  mkdir -p "$DIR"
  touch "$DIR/$MARKER"
  chmod 755 "$DIR"
  echo "dsync-galera-$$-$RANDOM" >"$DIR/cluster-name"
  local ports user_args=() owner="" i
  read -r -a ports <<<"$(pick_ports $((NODES * 4)))"
  [ "${#ports[@]}" = $((NODES * 4)) ] || die "could not pick $((NODES * 4)) free ports"
  if [ "$(id -u)" = 0 ]; then
    user_args=(--user=mysql)
    owner=mysql
  fi
  # Any failure from here on stops what was started; the directory is kept
  # for a look at the logs until stop removes it.
  trap 'kill_all; say "start failed; nothing left running; logs kept in $DIR (scripts/galera.sh stop removes it)"' EXIT
  local d
  for i in $(seq 1 "$NODES"); do
    d=$(node_dir "$i")
    mkdir -p "$d/tmp"
    printf 'sql=%s\ngcomm=%s\nist=%s\nsst=%s\n' "${ports[@]:$(((i - 1) * 4)):4}" >"$d/ports"
    if [ -n "$owner" ]; then
      chown "$owner:" "$d" "$d/tmp"
    fi
  done
  if [ -n "$owner" ] && ! runuser -u "$owner" -- test -w "$(node_dir 1)/tmp" 2>/dev/null; then
    die "the $owner user cannot write under $DIR (is a parent directory not traversable?); set DSYNC_GALERA_DIR to a directory under /tmp"
  fi
  d=$(node_dir 1)
  "$installdb" --no-defaults --datadir="$d/data" --tmpdir="$d/tmp" \
    --auth-root-authentication-method=normal --skip-test-db "${user_args[@]}" \
    >"$d/install-db.out" 2>&1 || {
    cat "$d/install-db.out" >&2
    die "$installdb failed"
  }
  # Joiners receive node 1's data by SST; a copy of its fresh datadir lets
  # them start (the transfer replaces it).
  for i in $(seq 2 "$NODES"); do
    cp -a "$(node_dir 1)/data" "$(node_dir "$i")/data"
  done
  launch 1 bootstrap
  wait_synced 1 1
  say "node 1 up (bootstrap), port $(port 1 sql)"
  for i in $(seq 2 "$NODES"); do
    launch "$i"
    wait_synced "$i" "$i"
    say "node $i joined, port $(port "$i" sql)"
  done
  wait_cluster
  # root over TCP without a password is what the tests use:
  for i in $(seq 1 "$NODES"); do
    sql "$i" "SELECT 1" >/dev/null || {
      log_tail "$i"
      die "root cannot log in over TCP without a password on node $i"
    }
  done
  trap - EXIT
  cmd_status
}

# kill_all SIGKILLs every process of the cluster (servers and SST helpers).
kill_all() {
  local p
  for p in $(our_processes); do
    kill -KILL "$p" 2>/dev/null || true
  done
  for p in $(our_processes); do
    wait_gone "$p" 10 || true
  done
}

cmd_stop() {
  if [ ! -e "$DIR" ]; then
    say "no cluster in $DIR"
    return 0
  fi
  if [ -d "$DIR" ] && [ -z "$(ls -A "$DIR")" ]; then
    rmdir "$DIR" # given to a start that failed before it wrote anything
    say "no cluster in $DIR; removed the empty directory"
    return 0
  fi
  [ -f "$DIR/$MARKER" ] || die "$DIR was not made by this script; not touching it"
  local n p pids=()
  for n in $(seq 1 "$NODES"); do
    if p=$(pid "$n"); then
      kill -TERM "$p" 2>/dev/null || true
      pids+=("$p")
    fi
  done
  for p in "${pids[@]}"; do
    if ! wait_gone "$p" 30; then
      say "pid $p did not stop within 30s: SIGKILL"
      kill -KILL "$p" 2>/dev/null || true
      wait_gone "$p" 10 || true
    fi
  done
  kill_all # SST helpers left behind by a node killed mid-transfer
  rm -rf "$DIR"
  say "stopped; removed $DIR"
}

cmd_kill() {
  check_node "${1:-}"
  need_cluster
  local p
  p=$(pid "$1") || die "node $1 is not running"
  kill -KILL "$p"
  wait_gone "$p" 10 || die "node $1 (pid $p) did not die within 10s of SIGKILL"
  say "node $1 (pid $p) killed"
}

cmd_restart() {
  check_node "${1:-}"
  local n=$1 p i others=0
  need_cluster
  if p=$(pid "$n"); then
    say "node $n is running (pid $p): stopping it first"
    kill -TERM "$p"
    wait_gone "$p" 30 || die "node $n (pid $p) did not stop within 30s"
  fi
  for i in $(seq 1 "$NODES"); do
    if [ "$i" != "$n" ] && pid "$i" >/dev/null; then
      others=$((others + 1))
    fi
  done
  [ "$others" -gt 0 ] || die "no other node is running: node $n has no cluster to rejoin"
  launch "$n"
  wait_cluster
  say "node $n rejoined, port $(port "$n" sql)"
}

cmd_status() {
  need_cluster
  local n p status size state ok=0
  for n in $(seq 1 "$NODES"); do
    if p=$(pid "$n"); then
      status=$(sql "$n" "SELECT VARIABLE_NAME, VARIABLE_VALUE FROM information_schema.GLOBAL_STATUS
        WHERE VARIABLE_NAME IN ('WSREP_CLUSTER_SIZE', 'WSREP_LOCAL_STATE_COMMENT')" 2>/dev/null || true)
      size=$(echo "$status" | awk '$1 == "WSREP_CLUSTER_SIZE" { print $2 }')
      state=$(echo "$status" | awk '$1 == "WSREP_LOCAL_STATE_COMMENT" { print $2 }')
      echo "node $n: pid $p, port $(port "$n" sql), cluster size ${size:-?}, ${state:-not answering}"
      if [ "$size" != "$NODES" ] || [ "$state" != Synced ]; then
        ok=1
      fi
    else
      echo "node $n: not running, port $(port "$n" sql)"
      ok=1
    fi
  done
  return "$ok"
}

cmd_dsn() {
  check_node "${1:-}"
  need_cluster
  echo "root@tcp(127.0.0.1:$(port "$1" sql))/"
}

case "${1:-}" in
start) cmd_start ;;
stop) cmd_stop ;;
kill) cmd_kill "${2:-}" ;;
restart) cmd_restart "${2:-}" ;;
status) cmd_status ;;
dsn) cmd_dsn "${2:-}" ;;
*)
  echo "usage: $0 start|stop|kill N|restart N|status|dsn N" >&2
  exit 2
  ;;
esac
