/*
 * grpc_load.cc - ctl-bench-grpc-load: the gRPC client side of ctl-bench
 * --vs-grpc. N client threads, each with one blocking call in flight, call
 * one ctl-bench-grpc-server; ctl-bench drives it over stdin and stdout, one
 * trial at a time, so that it can read the server's CPU around the timed
 * part alone.
 *
 *   ctl-bench-grpc-load --target HOST:PORT [--channels shared|per-thread]
 *
 * Commands, one a line on stdin; answers, one a line on stdout:
 *   run OP THREADS SECONDS MAXCALLS
 *       OP is describe (one key), stats or put (64 bytes). THREADS threads
 *       are started, each makes 10 untimed calls, then the program prints
 *       "ready" and waits for the line "go"; then every thread calls until
 *       SECONDS have passed or it has made MAXCALLS calls (0: no limit), and
 *       the program prints "ok CALLS SECONDS P50_US P99_US" (the latencies
 *       of every timed call of every thread), or "error TEXT" when a call
 *       failed (TEXT names the op and the status).
 *   End of input ends the program (exit 0).
 *
 * Channels: by default every thread calls through one shared channel (one
 * HTTP/2 connection, as a gRPC program usually has per server); with
 * --channels per-thread each thread has its own channel and connection
 * (as ctlrpc's client has a connection per call in flight). Every call
 * has a 30 s deadline, and the connection is awaited for 10 s at most.
 */
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "storage_bench.grpc.pb.h"

namespace {

const char *const kProg = "ctl-bench-grpc-load";
const int kMaxThreads = 64;
const int kCallSeconds = 30;
const int kWarmCalls = 10;
const char *const kDescribeKey = "bench-key";

using Clock = std::chrono::steady_clock;

enum class Op { kDescribe, kStats, kPut };

/* One thread's calls: its stub, its request, its latencies. */
struct Caller {
    ctlbench::Storage::Stub *stub = nullptr;
    Op op = Op::kStats;
    std::string put_key;
    std::string put_data = std::string(64, 'x');
    std::vector<uint64_t> lat_ns;
    std::string error;

    bool Call()
    {
        grpc::ClientContext ctx;
        ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(kCallSeconds));
        grpc::Status st;
        const char *what = "";
        switch (op) {
        case Op::kDescribe: {
            ctlbench::DescribeRequest req;
            ctlbench::DescribeReply rep;
            req.add_keys(kDescribeKey);
            st = stub->Describe(&ctx, req, &rep);
            what = "describe";
            if (st.ok() && rep.blobs_size() != 1)
                st = grpc::Status(grpc::StatusCode::INTERNAL, "not one blob in the reply");
            break;
        }
        case Op::kStats: {
            ctlbench::StatsRequest req;
            ctlbench::UnitStats rep;
            st = stub->Stats(&ctx, req, &rep);
            what = "stats";
            break;
        }
        case Op::kPut: {
            ctlbench::PutRequest req;
            ctlbench::PutReply rep;
            req.set_key(put_key);
            req.set_data(put_data);
            st = stub->Put(&ctx, req, &rep);
            what = "put";
            if (st.ok() && rep.stored() != put_data.size())
                st = grpc::Status(grpc::StatusCode::INTERNAL, "wrong size stored");
            break;
        }
        }
        if (!st.ok()) {
            std::ostringstream o;
            o << what << ": status " << int(st.error_code()) << " " << st.error_message();
            error = o.str();
            return false;
        }
        return true;
    }
};

/* The start gate: threads count themselves ready, then wait for go. */
struct Gate {
    std::mutex mu;
    std::condition_variable cv;
    int ready = 0;
    bool go = false, abandon = false;
};

bool ParseOp(const std::string &s, Op *op)
{
    if (s == "describe")
        *op = Op::kDescribe;
    else if (s == "stats")
        *op = Op::kStats;
    else if (s == "put")
        *op = Op::kPut;
    else
        return false;
    return true;
}

class Load {
  public:
    Load(const std::string &target, bool per_thread) : target_(target), per_thread_(per_thread) {}

    /* The channels; false (with a line on stderr) when the server cannot
     * be reached within 10 s. */
    bool Connect()
    {
        int n = per_thread_ ? kMaxThreads : 1;
        for (int i = 0; i < n; i++) {
            grpc::ChannelArguments args;
            /* Its own subchannel, hence its own connection. */
            args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
            args.SetInt("ctl-bench.channel", i);
            std::shared_ptr<grpc::Channel> ch = grpc::CreateCustomChannel(
                target_, grpc::InsecureChannelCredentials(), args);
            channels_.push_back(ch);
            stubs_.push_back(ctlbench::Storage::NewStub(ch));
        }
        if (!WaitConnected(1))
            return false;
        /* The key describe asks for (ctl-bench puts the same one in the unit). */
        Caller seed;
        seed.stub = stubs_[0].get();
        seed.op = Op::kPut;
        seed.put_key = kDescribeKey;
        seed.put_data = "0123456789";
        if (!seed.Call()) {
            std::fprintf(stderr, "%s: %s at %s\n", kProg, seed.error.c_str(), target_.c_str());
            return false;
        }
        return true;
    }

    /* One "run" command; the answer lines go to stdout. */
    void Run(Op op, int threads, double seconds, uint64_t max_calls)
    {
        if (!WaitConnected(threads)) {
            Answer("error cannot connect to " + target_);
            return;
        }
        std::vector<Caller> callers(threads);
        std::vector<std::thread> th;
        Gate gate;
        std::atomic<int> failed{0};
        Clock::time_point t0, deadline;
        std::vector<Clock::time_point> ends(threads);
        for (int i = 0; i < threads; i++) {
            Caller &c = callers[i];
            c.stub = stubs_[per_thread_ ? i : 0].get();
            c.op = op;
            c.put_key = "bench-put-" + std::to_string(i);
            th.emplace_back([&, i] {
                Caller &me = callers[i];
                bool ok = true;
                for (int k = 0; k < kWarmCalls && ok; k++)
                    ok = me.Call();
                if (!ok)
                    failed++;
                {
                    std::unique_lock<std::mutex> g(gate.mu);
                    gate.ready++;
                    gate.cv.notify_all();
                    gate.cv.wait(g, [&] { return gate.go || gate.abandon; });
                    if (gate.abandon)
                        ok = false;
                }
                uint64_t n = 0;
                while (ok && (max_calls == 0 || n < max_calls)) {
                    Clock::time_point a = Clock::now();
                    if (a >= deadline)
                        break;
                    if (!me.Call()) {
                        failed++;
                        break;
                    }
                    me.lat_ns.push_back(uint64_t(
                        std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - a)
                            .count()));
                    n++;
                }
                ends[i] = Clock::now();
            });
        }
        std::string line;
        {
            std::unique_lock<std::mutex> g(gate.mu);
            gate.cv.wait(g, [&] { return gate.ready == threads; });
        }
        bool go = false;
        if (failed.load() == 0) {
            Answer("ready");
            go = std::getline(std::cin, line) && line == "go";
        }
        {
            std::lock_guard<std::mutex> g(gate.mu);
            t0 = Clock::now();
            deadline = t0 + std::chrono::nanoseconds(int64_t(seconds * 1e9));
            gate.go = go;
            gate.abandon = !go;
            gate.cv.notify_all();
        }
        for (std::thread &t : th)
            t.join();
        for (const Caller &c : callers) {
            if (!c.error.empty()) {
                Answer("error " + c.error);
                return;
            }
        }
        if (!go) {
            Answer("error no go");
            return;
        }
        Clock::time_point end = t0;
        std::vector<uint64_t> all;
        for (int i = 0; i < threads; i++) {
            end = std::max(end, ends[i]);
            all.insert(all.end(), callers[i].lat_ns.begin(), callers[i].lat_ns.end());
        }
        if (all.empty()) {
            Answer("error no call was timed");
            return;
        }
        std::sort(all.begin(), all.end());
        double elapsed = std::chrono::duration<double>(end - t0).count();
        char out[160];
        std::snprintf(out, sizeof out, "ok %zu %.6f %.3f %.3f", all.size(), elapsed,
                      double(all[(all.size() - 1) * 50 / 100]) / 1e3,
                      double(all[(all.size() - 1) * 99 / 100]) / 1e3);
        Answer(out);
    }

  private:
    bool WaitConnected(int threads)
    {
        int n = per_thread_ ? threads : 1;
        auto until = std::chrono::system_clock::now() + std::chrono::seconds(10);
        for (int i = 0; i < n; i++) {
            if (!channels_[i]->WaitForConnected(until)) {
                std::fprintf(stderr, "%s: cannot connect to %s within 10 s\n", kProg,
                             target_.c_str());
                return false;
            }
        }
        return true;
    }

    static void Answer(const std::string &s)
    {
        std::fputs(s.c_str(), stdout);
        std::fputc('\n', stdout);
        std::fflush(stdout);
    }

    std::string target_;
    bool per_thread_;
    std::vector<std::shared_ptr<grpc::Channel>> channels_;
    std::vector<std::unique_ptr<ctlbench::Storage::Stub>> stubs_;
};

void usage(FILE *f)
{
    std::fprintf(f,
                 "usage: %s --target HOST:PORT [--channels shared|per-thread]\n"
                 "\n"
                 "The gRPC load generator of ctl-bench --vs-grpc, driven over stdin:\n"
                 "  run OP THREADS SECONDS MAXCALLS   (OP: describe, stats, put)\n"
                 "answers \"ready\", waits for \"go\", then answers\n"
                 "  ok CALLS SECONDS P50_US P99_US    or    error TEXT\n",
                 kProg);
}

} // namespace

int main(int argc, char **argv)
{
    std::string target, channels = "shared";
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            usage(stdout);
            return 0;
        }
        if ((a == "--target" || a == "--channels") && i + 1 < argc) {
            (a == "--target" ? target : channels) = argv[++i];
            continue;
        }
        std::fprintf(stderr, "%s: unexpected argument '%s'\n", kProg, a.c_str());
        usage(stderr);
        return 2;
    }
    if (target.rfind("tcp://", 0) == 0)
        target = target.substr(6);
    if (target.empty() || (channels != "shared" && channels != "per-thread")) {
        std::fprintf(stderr, "%s: %s\n", kProg,
                     target.empty() ? "--target HOST:PORT is required"
                                    : "--channels wants shared or per-thread");
        usage(stderr);
        return 2;
    }
    Load load(target, channels == "per-thread");
    if (!load.Connect())
        return 1;
    std::string line;
    while (std::getline(std::cin, line)) {
        std::istringstream in(line);
        std::string cmd, ops;
        int threads = 0;
        double seconds = 0;
        uint64_t max_calls = 0;
        Op op;
        if (!(in >> cmd >> ops >> threads >> seconds >> max_calls) || cmd != "run" ||
            !ParseOp(ops, &op) || threads < 1 || threads > kMaxThreads || !(seconds > 0)) {
            std::printf("error bad command '%s' (want: run describe|stats|put THREADS "
                        "SECONDS MAXCALLS, THREADS 1..%d)\n",
                        line.c_str(), kMaxThreads);
            std::fflush(stdout);
            continue;
        }
        load.Run(op, threads, seconds, max_calls);
    }
    return 0;
}
