#!/usr/bin/env bash
# The benchmark's history: appends one run's ratios to a CSV and draws the
# chart of every test's ratio against its target, run after run.
#
#   bash benches/history.sh append TABLE.md CSV COMMIT DATE
#   bash benches/history.sh draw CSV PNG
#
# `append` reads the uroce table that benches/perftest.sh prints (rows
# `| test | MTU | uroce | yardstick | ratio | target |`), keeps the rows
# that carry a target (not "(reference)") and appends to CSV, one line
# each:
#
#   date,commit,test,mtu,ratio,target
#
# ratio as a plain number (38% -> 0.38, 3.12x -> 3.12), target as the
# comparison and its number (>=0.50, <=1.50, <0.01); commas in a test's
# name are dropped. perftest.sh calls it after every full run.
#
# `draw` plots, for each (test, MTU) in CSV, the ratio of every run (x:
# the run's order, labelled by commit) and its target as a dashed line,
# one panel per test, with gnuplot into PNG.
set -uo pipefail

die() { echo "history.sh: $*" >&2; exit 1; }

append() {
  local table=$1 csv=$2 commit=$3 date=$4
  [ -r "$table" ] || die "cannot read $table"
  [[ $commit =~ ^[0-9a-zA-Z._+-]+$ ]] || die "bad commit '$commit'"
  [[ $date =~ ^[0-9T:Z+-]+$ ]] || die "bad date '$date'"
  [ -s "$csv" ] || echo "date,commit,test,mtu,ratio,target" >"$csv" || die "cannot write $csv"
  awk -F'|' -v date="$date" -v commit="$commit" '
    function trim(s) { gsub(/^[ \t]+|[ \t]+$/, "", s); return s }
    # "38%" -> 0.38, "5.6%" -> 0.056, "3.12×" -> 3.12; "" if neither.
    function ratio(s) {
      s = trim(s)
      if (s ~ /^[0-9]+(\.[0-9]+)?%$/) { sub(/%$/, "", s); return s / 100 }
      if (s ~ /^[0-9]+(\.[0-9]+)?×$/) { sub(/×$/, "", s); return s + 0 }
      return ""
    }
    # "≥ 50%: met" -> ">=0.5", "≤ 1.5×: **missed**" -> "<=1.5", "< 1%: met" -> "<0.01",
    # "≤ 1.1× RC: **missed**" -> "<=1.1".
    function target(s,   op, v) {
      s = trim(s)
      sub(/:.*/, "", s)
      if (s ~ /^≥ /) op = ">="; else if (s ~ /^≤ /) op = "<="; else if (s ~ /^< /) op = "<"; else return ""
      sub(/^[^ ]+ /, "", s)
      # "1.1× RC" (a ratio to another uroce figure) -> "1.1×"
      sub(/× .*$/, "×", s)
      v = ratio(s)
      return v == "" ? "" : op v
    }
    NF == 8 && $2 !~ /^ *(perftest|---)/ {
      t = target($7)
      r = ratio($6)
      if (t == "" || r == "") next
      name = trim($2); gsub(/,/, "", name)
      mtu = trim($3); if (mtu !~ /^[0-9]+$/) mtu = "-"
      printf "%s,%s,%s,%s,%s,%s\n", date, commit, name, mtu, r, t
      n++
    }
    END { if (!n) exit 1 }
  ' "$table" >>"$csv" || die "no ratio with a target in $table"
}

draw() {
  local csv=$1 png=$2
  [ -r "$csv" ] || die "cannot read $csv"
  command -v gnuplot >/dev/null || die "gnuplot missing (apt-get install gnuplot-nox)"
  local dir
  dir=$(mktemp -d) || die "mktemp"
  # One data file per series (x = the run's number in order of the CSV,
  # the ratio, the commit) and a gnuplot script with a panel each.
  awk -F, -v dir="$dir" '
    NR == 1 { next }
    {
      run = $1 "," $2
      if (!(run in runno)) { runno[run] = ++runs; label[runs] = $2 }
      key = $4 == "-" ? $3 : $3 " (MTU " $4 ")"
      if (!(key in series)) { series[key] = ++ns; name[ns] = key }
      k = series[key]
      tgt[k] = $6
      print runno[run], $5 > (dir "/s" k ".dat")
    }
    END {
      cols = 3; rows = int((ns + cols - 1) / cols)
      printf "set terminal pngcairo noenhanced size %d,%d font \",8\"\n", 520 * cols, 260 * rows > (dir "/plot.gp")
      printf "set output \"%s/out.png\"\n", dir >> (dir "/plot.gp")
      printf "set multiplot layout %d,%d title \"uroce against its targets, run by run (benches/perftest.sh)\"\n", rows, cols >> (dir "/plot.gp")
      tics = ""
      for (r = 1; r <= runs; r++) tics = tics (r > 1 ? ", " : "") "\"" label[r] "\" " r
      printf "set xtics (%s) rotate by 30 right\nset xrange [0.5:%f]\nset grid ytics\nset key off\nset offsets 0, 0, graph 0.15, 0\n", tics, runs + 0.5 >> (dir "/plot.gp")
      for (k = 1; k <= ns; k++) {
        t = tgt[k]; op = t; sub(/[0-9.]+$/, "", op); v = substr(t, length(op) + 1)
        pct = (op != "<=") ? 1 : 0
        shown = pct ? sprintf("%g%%", v * 100) : sprintf("%gx", v)
        n = name[k]; gsub(/"/, "", n)
        printf "set title \"%s: target %s %s\"\n", n, op, shown >> (dir "/plot.gp")
        printf "set yrange [0:*]\n" >> (dir "/plot.gp")
        printf "plot \"%s/s%d.dat\" using 1:2 with linespoints lw 2 pt 7, %s with lines dt 2 lc rgb \"red\"\n", dir, k, v >> (dir "/plot.gp")
      }
      print "unset multiplot" >> (dir "/plot.gp")
    }
  ' "$csv" || { rm -rf "$dir"; die "cannot read the series of $csv"; }
  if gnuplot "$dir/plot.gp" 2>"$dir/err" && [ -s "$dir/out.png" ]; then
    cp "$dir/out.png" "$png" || { rm -rf "$dir"; die "cannot write $png"; }
  else
    cat "$dir/err" >&2
    rm -rf "$dir"
    die "gnuplot failed"
  fi
  rm -rf "$dir"
}

case "${1:-}" in
  append) [ $# = 5 ] || die "usage: append TABLE.md CSV COMMIT DATE"; append "$2" "$3" "$4" "$5" ;;
  draw) [ $# = 3 ] || die "usage: draw CSV PNG"; draw "$2" "$3" ;;
  *) die "usage: history.sh append TABLE.md CSV COMMIT DATE | draw CSV PNG" ;;
esac
