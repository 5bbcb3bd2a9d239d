// batch_norm with sync = true under data_parallel (PyTorch's SyncBatchNorm): the nodes' statistics and input
// gradients over every replica's and process's rows, computed on the host between the replicas' segments of the step.
#include "sync_batch_norm.hpp"

#include <algorithm>
#include <cmath>
#include <variant>

#include "kiln/error.hpp"

namespace kiln::parallel {

namespace {

// BatchNormForward over the global batch (ops.hpp's semantics with m = every replica's n * inner): mean and
// biased variance from two passes in double precision, each replica summing its own rows on its lane, the sums
// added over replicas and processes here; every replica gets the same mean, rstd and running statistics and
// normalizes its own rows with them.
void forward(const std::vector<Executor*>& ex, size_t node, const EachWithRows& each_with_rows,
             const ReduceSums& all_reduce_double) {
  const size_t R = ex.size();
  const Node& n0 = ex[0]->graph().nodes()[node];
  const auto& a0 = std::get<BatchNormAttrs>(n0.attrs);
  const auto C = static_cast<size_t>(a0.c), I = static_cast<size_t>(a0.inner);
  std::vector<HostTensor> x(R);
  std::vector<std::vector<double>> part(R, std::vector<double>(C + 1, 0.0));  // per channel, then the count
  // Per channel of replica r's rows: the sum of f(value).
  auto channel_sums = [&](size_t r, auto f) {
    const size_t N = x[r].data.size() / (C * I);
    for (size_t o = 0; o < N; ++o)
      for (size_t c = 0; c < C; ++c) {
        const float* p = x[r].data.data() + (o * C + c) * I;
        double acc = 0;
        for (size_t i = 0; i < I; ++i) acc += f(c, p[i]);
        part[r][c] += acc;
      }
  };
  each_with_rows([&](size_t r) {
    x[r] = ex[r]->read(ex[r]->graph().nodes()[node].in[0]);
    channel_sums(r, [](size_t, float v) { return double(v); });
    part[r][C] = static_cast<double>(x[r].data.size() / C);
  });
  std::vector<double> sum(C + 1, 0.0);
  for (size_t r = 0; r < R; ++r)
    for (size_t c = 0; c <= C; ++c) sum[c] += part[r][c];
  all_reduce_double(sum);
  const double m = sum[C];
  std::vector<double> mean(C), sq(C, 0.0);
  for (size_t c = 0; c < C; ++c) mean[c] = m > 0 ? sum[c] / m : 0.0;
  each_with_rows([&](size_t r) {
    std::fill(part[r].begin(), part[r].end(), 0.0);
    channel_sums(r, [&](size_t c, float v) { return (v - mean[c]) * (v - mean[c]); });
  });
  for (size_t r = 0; r < R; ++r)
    for (size_t c = 0; c < C; ++c) sq[c] += part[r][c];
  all_reduce_double(sq);
  HostTensor mean_out(Shape{a0.c}), rstd_out(Shape{a0.c});
  HostTensor run_mean = ex[0]->read(n0.out[3]), run_var = ex[0]->read(n0.out[4]);
  std::vector<double> rstd(C);
  const double mom = a0.momentum;
  for (size_t c = 0; c < C; ++c) {
    const double var = m > 0 ? sq[c] / m : 0.0;
    rstd[c] = 1.0 / std::sqrt(var + double(a0.eps));
    mean_out.data[c] = static_cast<float>(mean[c]);
    rstd_out.data[c] = static_cast<float>(rstd[c]);
    const double unbiased = m > 1 ? var * m / (m - 1) : var;
    run_mean.data[c] = static_cast<float>((1.0 - mom) * run_mean.data[c] + mom * mean[c]);
    run_var.data[c] = static_cast<float>((1.0 - mom) * run_var.data[c] + mom * unbiased);
  }
  // Every replica keeps the same running statistics, those without rows in this batch included.
  for (size_t r = 0; r < R; ++r) {
    const Node& nd = ex[r]->graph().nodes()[node];
    ex[r]->write(nd.out[3], run_mean);
    ex[r]->write(nd.out[4], run_var);
  }
  each_with_rows([&](size_t r) {
    const Node& nd = ex[r]->graph().nodes()[node];
    const HostTensor gamma = ex[r]->read(nd.in[1]), beta = ex[r]->read(nd.in[2]);
    HostTensor& y = x[r];  // normalized in place, then written to the node's output
    const size_t N = y.data.size() / (C * I);
    for (size_t o = 0; o < N; ++o)
      for (size_t c = 0; c < C; ++c) {
        float* p = y.data.data() + (o * C + c) * I;
        const double scale = rstd[c] * gamma.data[c], shift = beta.data[c] - mean[c] * scale;
        for (size_t i = 0; i < I; ++i) p[i] = static_cast<float>(p[i] * scale + shift);
      }
    ex[r]->write(nd.out[0], y);
    ex[r]->write(nd.out[1], mean_out);
    ex[r]->write(nd.out[2], rstd_out);
  });
}

// BatchNormBackward over the global batch. Each replica's dy is the gradient of its own mean loss, share =
// rows / global of the step's loss: the means over the global batch are taken of share * dy, and the replica's
// dx is divided by its share again (its later gradients are scaled by it, as every gradient is). dgamma and
// dbeta are the replica's own sums, which the gradient all-reduce adds up like any other gradient.
void backward(const std::vector<Executor*>& ex, const std::vector<int64_t>& rows, int64_t global, size_t node,
              const EachWithRows& each_with_rows, const ReduceSums& all_reduce_double) {
  const size_t R = ex.size();
  const Node& n0 = ex[0]->graph().nodes()[node];
  const auto& a0 = std::get<BatchNormAttrs>(n0.attrs);
  const auto C = static_cast<size_t>(a0.c), I = static_cast<size_t>(a0.inner);
  // The saved statistics are the same on every replica (the forward pass wrote them).
  const HostTensor mean = ex[0]->read(n0.in[2]), rstd = ex[0]->read(n0.in[3]);
  std::vector<HostTensor> x(R), dy(R);
  std::vector<std::vector<double>> sdy(R, std::vector<double>(C, 0.0)), sdyx(R, std::vector<double>(C, 0.0));
  std::vector<double> count(R, 0.0);
  each_with_rows([&](size_t r) {
    const Node& nd = ex[r]->graph().nodes()[node];
    x[r] = ex[r]->read(nd.in[0]);
    dy[r] = ex[r]->read(nd.in[4]);
    const size_t N = x[r].data.size() / (C * I);
    for (size_t o = 0; o < N; ++o)
      for (size_t c = 0; c < C; ++c) {
        const size_t j = (o * C + c) * I;
        const double mu = mean.data[c], rs = rstd.data[c];
        double a = 0, b = 0;
        for (size_t i = 0; i < I; ++i) {
          a += dy[r].data[j + i];
          b += double(dy[r].data[j + i]) * (x[r].data[j + i] - mu) * rs;
        }
        sdy[r][c] += a;
        sdyx[r][c] += b;
      }
    count[r] = static_cast<double>(N * I);
  });
  std::vector<double> total(2 * C + 1, 0.0);  // share-weighted sums of dy, then of dy * xhat, then m
  for (size_t r = 0; r < R; ++r) {
    if (rows[r] == 0) continue;
    const double share = static_cast<double>(rows[r]) / static_cast<double>(global);
    for (size_t c = 0; c < C; ++c) total[c] += share * sdy[r][c], total[C + c] += share * sdyx[r][c];
    total[2 * C] += count[r];
  }
  all_reduce_double(total);
  const double m = total[2 * C];
  each_with_rows([&](size_t r) {
    const Node& nd = ex[r]->graph().nodes()[node];
    const HostTensor gamma = ex[r]->read(nd.in[1]);
    const double share = static_cast<double>(rows[r]) / static_cast<double>(global);
    HostTensor dgamma(Shape{a0.c}), dbeta(Shape{a0.c});
    HostTensor& dx = dy[r];  // overwritten in place
    const size_t N = dx.data.size() / (C * I);
    for (size_t c = 0; c < C; ++c) {
      const double ga = gamma.data[c], rs = rstd.data[c], mu = mean.data[c];
      const double mg = m > 0 ? ga * total[c] / m / share : 0.0, mgx = m > 0 ? ga * total[C + c] / m / share : 0.0;
      for (size_t o = 0; o < N; ++o) {
        const size_t j = (o * C + c) * I;
        for (size_t i = 0; i < I; ++i) {
          const double xhat = (x[r].data[j + i] - mu) * rs;
          dx.data[j + i] = static_cast<float>(rs * (double(dx.data[j + i]) * ga - mg - xhat * mgx));
        }
      }
      dgamma.data[c] = static_cast<float>(sdyx[r][c]);
      dbeta.data[c] = static_cast<float>(sdy[r][c]);
    }
    ex[r]->write(nd.out[0], dx);
    ex[r]->write(nd.out[1], dgamma);
    ex[r]->write(nd.out[2], dbeta);
  });
}

}  // namespace

// The synchronized batch norms (sync = true, PyTorch's SyncBatchNorm) among nodes [begin, end) of the replicas'
// training graphs, which share one node order: forward nodes (recomputed ones in backward too) and backward
// nodes.
std::vector<size_t> sync_batch_norm_nodes(const std::vector<Executor*>& ex, size_t begin, size_t end) {
  std::vector<size_t> out;
  const auto& nodes = ex[0]->graph().nodes();
  for (size_t i = begin; i < end && i < nodes.size(); ++i) {
    const auto* a = std::get_if<BatchNormAttrs>(&nodes[i].attrs);
    if (!a || !a->sync || !a->training) continue;
    if (nodes[i].kind != OpKind::BatchNormForward && nodes[i].kind != OpKind::BatchNormBackward) continue;
    for (const Executor* e : ex)
      if (e->graph().nodes().size() <= i || e->graph().nodes()[i].kind != nodes[i].kind)
        throw Error("data_parallel: the replicas' graphs differ at synchronized batch norm node " + std::to_string(i) +
                    " (layer '" + nodes[i].layer + "')");
    out.push_back(i);
  }
  return out;
}

void sync_batch_norm(const std::vector<Executor*>& ex, const std::vector<int64_t>& rows, int64_t global, size_t node,
                     const EachWithRows& each_with_rows, const ReduceSums& reduce) {
  if (ex[0]->graph().nodes()[node].kind == OpKind::BatchNormForward)
    forward(ex, node, each_with_rows, reduce);
  else
    backward(ex, rows, global, node, each_with_rows, reduce);
}

}  // namespace kiln::parallel
