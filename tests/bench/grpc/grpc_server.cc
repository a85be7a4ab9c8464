/*
 * grpc_server.cc - ctl-bench-grpc-server: the storage unit's describe, stats
 * and put (storage_bench.proto) served by gRPC C++, for ctl-bench --vs-grpc.
 *
 *   ctl-bench-grpc-server --mode sync|callback [--bind HOST:PORT] [--capacity BYTES]
 *
 * --mode sync is gRPC's synchronous server (Storage::Service, the handlers run
 * on the server's own thread pool); --mode callback is its callback server
 * (Storage::CallbackService, handlers run on gRPC's event threads and finish
 * a reactor). The store is a hash map of blobs under one mutex, with the
 * counters ctl-storage-unit's stats reports: the ops do what the unit's do
 * (describe looks the keys up, stats reads the counters, put copies the data
 * in, replacing the blob of that key).
 *
 * Prints its bound address as the first line of stdout, as
 * tcp://127.0.0.1:PORT (the form ctl-bench reads from every server it
 * starts), serves until SIGTERM or SIGINT, then shuts down (in-flight calls
 * get 2 s). Binds 127.0.0.1:0 unless told otherwise. Exit status 0 after a
 * clean stop, 1 when it cannot serve, 2 for a bad command line.
 */
#include <grpcpp/grpcpp.h>

#include <pthread.h>
#include <signal.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "storage_bench.grpc.pb.h"

namespace {

const char *const kProg = "ctl-bench-grpc-server";

struct Blob {
    std::string data;
    bool pinned = false;
};

/* The blobs and counters; every op takes the lock, as the unit's handlers
 * run under its lock. */
class Store {
  public:
    explicit Store(uint64_t capacity) : capacity_(capacity) {}

    grpc::Status Describe(const ctlbench::DescribeRequest &req, ctlbench::DescribeReply *rep)
    {
        std::lock_guard<std::mutex> g(mu_);
        requests_++;
        std::string missing;
        for (const std::string &k : req.keys()) {
            auto it = blobs_.find(k);
            if (it == blobs_.end()) {
                missing += missing.empty() ? k : ", " + k;
                continue;
            }
            ctlbench::BlobInfo *b = rep->add_blobs();
            b->set_key(k);
            b->set_size(it->second.data.size());
            b->set_pinned(it->second.pinned);
            b->set_spilled(false);
        }
        if (!missing.empty()) {
            rep->Clear();
            return grpc::Status(grpc::StatusCode::NOT_FOUND, "missing: " + missing);
        }
        return grpc::Status::OK;
    }

    grpc::Status Stats(ctlbench::UnitStats *rep)
    {
        std::lock_guard<std::mutex> g(mu_);
        requests_++;
        rep->set_blobs(blobs_.size());
        rep->set_bytes(bytes_);
        rep->set_capacity(capacity_);
        rep->set_pinned(pinned_);
        rep->set_spilled(0);
        rep->set_requests(requests_);
        rep->set_dropped(0);
        return grpc::Status::OK;
    }

    grpc::Status Put(const ctlbench::PutRequest &req, ctlbench::PutReply *rep)
    {
        std::lock_guard<std::mutex> g(mu_);
        requests_++;
        auto it = blobs_.find(req.key());
        uint64_t old = it == blobs_.end() ? 0 : it->second.data.size();
        if (it != blobs_.end() && it->second.pinned)
            return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                "pinned: " + req.key());
        if (bytes_ - old + req.data().size() > capacity_)
            return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                "unit full: " + req.key());
        Blob &b = blobs_[req.key()];
        b.data = req.data();
        bytes_ = bytes_ - old + b.data.size();
        if (req.pin() && !b.pinned) {
            b.pinned = true;
            pinned_++;
        }
        rep->set_stored(b.data.size());
        return grpc::Status::OK;
    }

  private:
    std::mutex mu_;
    std::unordered_map<std::string, Blob> blobs_;
    uint64_t capacity_;
    uint64_t bytes_ = 0, pinned_ = 0, requests_ = 0;
};

/* The synchronous server: a handler per call on the server's thread pool. */
class SyncService final : public ctlbench::Storage::Service {
  public:
    explicit SyncService(Store &s) : s_(s) {}
    grpc::Status Describe(grpc::ServerContext *, const ctlbench::DescribeRequest *req,
                          ctlbench::DescribeReply *rep) override
    {
        return s_.Describe(*req, rep);
    }
    grpc::Status Stats(grpc::ServerContext *, const ctlbench::StatsRequest *,
                       ctlbench::UnitStats *rep) override
    {
        return s_.Stats(rep);
    }
    grpc::Status Put(grpc::ServerContext *, const ctlbench::PutRequest *req,
                     ctlbench::PutReply *rep) override
    {
        return s_.Put(*req, rep);
    }

  private:
    Store &s_;
};

/* The callback server: each handler finishes its call's default reactor
 * at once (the ops never block). */
class CallbackService final : public ctlbench::Storage::CallbackService {
  public:
    explicit CallbackService(Store &s) : s_(s) {}
    grpc::ServerUnaryReactor *Describe(grpc::CallbackServerContext *ctx,
                                       const ctlbench::DescribeRequest *req,
                                       ctlbench::DescribeReply *rep) override
    {
        return Finish(ctx, s_.Describe(*req, rep));
    }
    grpc::ServerUnaryReactor *Stats(grpc::CallbackServerContext *ctx,
                                    const ctlbench::StatsRequest *,
                                    ctlbench::UnitStats *rep) override
    {
        return Finish(ctx, s_.Stats(rep));
    }
    grpc::ServerUnaryReactor *Put(grpc::CallbackServerContext *ctx,
                                  const ctlbench::PutRequest *req,
                                  ctlbench::PutReply *rep) override
    {
        return Finish(ctx, s_.Put(*req, rep));
    }

  private:
    static grpc::ServerUnaryReactor *Finish(grpc::CallbackServerContext *ctx,
                                            const grpc::Status &st)
    {
        grpc::ServerUnaryReactor *r = ctx->DefaultReactor();
        r->Finish(st);
        return r;
    }
    Store &s_;
};

void usage(FILE *f)
{
    std::fprintf(f,
                 "usage: %s --mode sync|callback [--bind HOST:PORT] [--capacity BYTES]\n"
                 "\n"
                 "Serve the storage unit's describe, stats and put over gRPC (ctl-bench\n"
                 "--vs-grpc starts it). Prints tcp://HOST:PORT, the address it is bound\n"
                 "to, on the first line of stdout; stops on SIGTERM or SIGINT.\n"
                 "\n"
                 "  --mode sync      gRPC's synchronous server (a thread pool)\n"
                 "  --mode callback  gRPC's callback server (reactors)\n"
                 "  --bind           where to listen (default 127.0.0.1:0, any free port)\n"
                 "  --capacity       bytes of blobs held (default 1073741824)\n",
                 kProg);
}

} // namespace

int main(int argc, char **argv)
{
    std::string mode, bind = "127.0.0.1:0";
    uint64_t capacity = uint64_t(1) << 30;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        if (a == "--help" || a == "-h") {
            usage(stdout);
            return 0;
        }
        if ((a == "--mode" || a == "--bind" || a == "--capacity") && i + 1 < argc) {
            const char *v = argv[++i];
            if (a == "--mode") {
                mode = v;
            } else if (a == "--bind") {
                bind = v;
            } else {
                char *end = nullptr;
                capacity = std::strtoull(v, &end, 10);
                if (!*v || *end) {
                    std::fprintf(stderr, "%s: --capacity '%s' is not a number of bytes\n",
                                 kProg, v);
                    return 2;
                }
            }
            continue;
        }
        std::fprintf(stderr, "%s: unexpected argument '%s'\n", kProg, a.c_str());
        usage(stderr);
        return 2;
    }
    if (mode != "sync" && mode != "callback") {
        std::fprintf(stderr, "%s: --mode wants sync or callback (got '%s')\n", kProg,
                     mode.c_str());
        usage(stderr);
        return 2;
    }

    /* SIGTERM and SIGINT are taken by sigwait below: block them before
     * gRPC starts its threads, which inherit the mask. */
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop, nullptr);

    Store store(capacity);
    SyncService sync_service(store);
    CallbackService callback_service(store);
    int port = 0;
    grpc::ServerBuilder b;
    b.AddListeningPort(bind, grpc::InsecureServerCredentials(), &port);
    if (mode == "sync")
        b.RegisterService(&sync_service);
    else
        b.RegisterService(&callback_service);
    std::unique_ptr<grpc::Server> server = b.BuildAndStart();
    if (!server || port == 0) {
        std::fprintf(stderr, "%s: cannot listen on %s\n", kProg, bind.c_str());
        return 1;
    }
    std::string host = bind.substr(0, bind.rfind(':'));
    std::printf("tcp://%s:%d\n", host.c_str(), port);
    std::fflush(stdout);

    int sig = 0;
    while (sigwait(&stop, &sig) != 0)
        ;
    server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
    server->Wait();
    return 0;
}
