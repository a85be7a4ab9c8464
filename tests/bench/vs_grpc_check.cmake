# The smoke test of `ctl-bench --vs-grpc --quick` (ctest bench_vs_grpc_quick): it must exit 0
# (every call of every side answered) and print the table: a block per load, a row per op with
# a figure for ctlrpc and both gRPC servers, the floor, RSS and disk. No figure is judged.
#   cmake -DCTL_BENCH=path/to/ctl-bench -P vs_grpc_check.cmake
execute_process(COMMAND "${CTL_BENCH}" --vs-grpc --quick
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 280)
message("${out}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "ctl-bench --vs-grpc --quick exited ${rc}:\n${err}")
endif()
set(num "[0-9]+(\\.[0-9]+)?")
set(expected
  "op +metric +ctlrpc +grpc-sync +grpc-cb +sync/ctlrpc +cb/ctlrpc"
  "-- 1 client thread, one blocking call in flight each"
  "-- 4 client threads, one blocking call in flight each"
  "-- 16 client threads, one blocking call in flight each"
  "describe\\(1 key\\) +p50 us +${num} +${num} +${num} +${num}x +${num}x"
  "stats +p50 us +${num} +${num} +${num} +${num}x +${num}x"
  "put 64 B +p50 us +${num} +${num} +${num} +${num}x +${num}x"
  "calls/s +${num} +${num} +${num}"
  "srv CPU us/call +${num} +${num} +${num}"
  "server +RSS MiB +${num} +${num} +${num}"
  "floor: 64 B echo +raw TCP +ZeroMQ"
  "p50 us +${num} +${num}\n +p99 us +${num} +${num}\n +calls/s"
  "server +MB, all files +${num} +${num} +${num}")
foreach(re IN LISTS expected)
  if(NOT out MATCHES "${re}")
    message(FATAL_ERROR "ctl-bench --vs-grpc --quick: no line matching '${re}' in its table")
  endif()
endforeach()
# A zero where a side should have answered: p50 of every op on every side is above 0.
if(out MATCHES "p50 us +0\\.0 " OR out MATCHES "p50 us +[0-9.]+ +0\\.0 " OR
   out MATCHES "p50 us +[0-9.]+ +[0-9.]+ +0\\.0 ")
  message(FATAL_ERROR "ctl-bench --vs-grpc --quick: a side has no latency")
endif()
