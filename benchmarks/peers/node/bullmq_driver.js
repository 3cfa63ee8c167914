// Load driver for BullMQ on Redis, with BullMQ's own Node client (and ioredis).
//
// Every producer is a Queue and every worker a Worker with its own Redis
// connection and one request in flight (closed loop). Enqueue = `queue.add`
// (removeOnComplete, so an ack deletes the job as in sepp); drain = manual
// reserve/ack: `worker.getNextJob(token, {block: false})` then
// `job.moveToCompleted(value, token, false)` (no fetch-next), two requests per job,
// the clock stopping at the last ack; latency = add -> getNextJob -> moveToCompleted.
// Prints one JSON line in benchmarks/loadgen.py's format.
//
//   node bullmq_driver.js --port 6379 --connections 50 --jobs 200000
'use strict';

const { Queue, Worker } = require('bullmq');
const { PAYLOAD, parseArgs, procCpu } = require('./common');

const DEFAULTS = {
  host: '127.0.0.1', port: 6379, connections: 50, jobs: 200000, rounds: 2000,
  phases: ['enqueue', 'drain', 'latency'], serverPid: 0, queue: 'bench',
};

function ownCpu() {
  const u = process.cpuUsage();
  return (u.user + u.system) / 1e6;
}

function now() {
  return Number(process.hrtime.bigint()) / 1e9;
}

async function phase(result, name, serverPid, work) {
  const own0 = ownCpu(), server0 = procCpu(serverPid), wall0 = now();
  const body = await work();
  const wall = now() - wall0;
  body.client_cpu = (ownCpu() - own0) / wall;
  body.server_cpu = (procCpu(serverPid) - server0) / wall;
  result[name] = body;
}

function rate(jobs, seconds) {
  return { jobs, seconds, jobs_per_s: seconds > 0 ? jobs / seconds : 0 };
}

async function main() {
  const args = parseArgs(process.argv.slice(2), DEFAULTS);
  const connection = { host: args.host, port: args.port, maxRetriesPerRequest: null };
  const jobOpts = { removeOnComplete: true, removeOnFail: true };
  const result = {};

  const queues = [];
  for (let i = 0; i < args.connections; i++) {
    const q = new Queue(args.queue, { connection });
    await q.waitUntilReady();
    queues.push(q);
  }

  if (args.phases.includes('enqueue')) {
    await phase(result, 'enqueue', args.serverPid, async () => {
      let remaining = args.jobs;
      const producer = async (q) => {
        while (remaining > 0) {
          remaining--;
          await q.add('bench', PAYLOAD, jobOpts);
        }
      };
      const t0 = now();
      await Promise.all(queues.map(producer));
      return rate(args.jobs, now() - t0);
    });
  }

  const workers = [];
  if (args.phases.includes('drain') || args.phases.includes('latency')) {
    for (let i = 0; i < args.connections; i++) {
      const w = new Worker(args.queue, null, { connection, autorun: false });
      await w.waitUntilReady();
      workers.push(w);
    }
  }

  if (args.phases.includes('drain')) {
    await phase(result, 'drain', args.serverPid, async () => {
      let done = 0;
      let lastAck = 0;
      const worker = async (w, i) => {
        let n = 0;
        while (done < args.jobs) {
          const token = `w${i}-${n++}`;
          const job = await w.getNextJob(token, { block: false });
          if (!job) return;
          await job.moveToCompleted('ok', token, false);
          done++;
          lastAck = now();
        }
      };
      const t0 = now();
      await Promise.all(workers.map(worker));
      return rate(done, lastAck - t0);
    });
  }

  if (args.phases.includes('latency')) {
    await phase(result, 'latency', args.serverPid, async () => {
      const q = queues[0];
      const w = workers[0];
      const samples = [];
      for (let r = 0; r < args.rounds; r++) {
        const token = `lat-${r}`;
        const t0 = now();
        await q.add('bench', PAYLOAD, jobOpts);
        let job = await w.getNextJob(token, { block: false });
        while (!job) job = await w.getNextJob(token, { block: false });
        await job.moveToCompleted('ok', token, false);
        samples.push(now() - t0);
      }
      samples.sort((a, b) => a - b);
      const pct = (p) => samples[Math.min(samples.length - 1, Math.floor(samples.length * p))] * 1000;
      return { rounds: args.rounds, p50_ms: pct(0.5), p99_ms: pct(0.99), p999_ms: pct(0.999) };
    });
  }

  await Promise.all(workers.map((w) => w.close(true)));
  await Promise.all(queues.map((q) => q.close()));
  result.pid = process.pid;
  result.client = `bullmq ${require('bullmq/package.json').version} + ioredis ${require('ioredis/package.json').version} (node ${process.version})`;
  result.driver = 'node (one event loop)';
  process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
