// User-level client benchmark of BullMQ (compare.py's "clients" section): BullMQ's
// own API as its users write it, from ONE Node process.
//
//   producer: one Queue, N concurrent callers each awaiting queue.add(...) one job
//             at a time (removeOnComplete, so an ack deletes the job as in sepp);
//   worker:   one Worker(queue, async no-op, {concurrency: N}) running on its own
//             (autorun: BullMQ fetches the next job with each completion); the clock
//             stops at the 'completed' event of the last job.
//
// The worker works the jobs the producer phase left (topped up with addBulk, not
// timed, when fewer are waiting). Prints one JSON line: per phase jobs, seconds,
// jobs_per_s, client_cpu_s (this process), server_cpu_s (Redis), their per-job µs
// and client_cpu (share of one core).
//
//   node bullmq_client.js --port 6379 --jobs 50000 --concurrency 50 --server-pid PID
'use strict';

const { Queue, Worker } = require('bullmq');
const { PAYLOAD, parseArgs, procCpu } = require('./common');

const DEFAULTS = {
  host: '127.0.0.1', port: 6379, concurrency: 50, jobs: 50000,
  phases: ['producer', 'worker'], serverPid: 0, queue: 'bench-clients',
};

const JOB_OPTS = { removeOnComplete: true, removeOnFail: true };

function mark(serverPid) {
  const u = process.cpuUsage();
  return {
    wall: Number(process.hrtime.bigint()) / 1e9,
    cpu: (u.user + u.system) / 1e6,
    server: procCpu(serverPid),
  };
}

function result(jobs, start, end) {
  const seconds = end.wall - start.wall;
  const cpu = end.cpu - start.cpu;
  const server = end.server - start.server;
  return {
    jobs, seconds,
    jobs_per_s: seconds > 0 ? jobs / seconds : 0,
    client_cpu_s: cpu, server_cpu_s: server,
    client_us_per_job: cpu / jobs * 1e6, server_us_per_job: server / jobs * 1e6,
    client_cpu: seconds > 0 ? cpu / seconds : 0,
  };
}

async function main() {
  const args = parseArgs(process.argv.slice(2), DEFAULTS);
  const connection = { host: args.host, port: args.port, maxRetriesPerRequest: null };
  const out = {};
  const queue = new Queue(args.queue, { connection });
  await queue.waitUntilReady();

  if (args.phases.includes('producer')) {
    let remaining = args.jobs;
    const caller = async () => {
      while (remaining > 0) {
        remaining--;
        await queue.add('bench', PAYLOAD, JOB_OPTS);
      }
    };
    const start = mark(args.serverPid);
    await Promise.all(Array.from({ length: args.concurrency }, caller));
    out.producer = result(args.jobs, start, mark(args.serverPid));
  }

  if (args.phases.includes('worker')) {
    const counts = await queue.getJobCounts('wait');
    for (let left = args.jobs - counts.wait; left > 0; left -= 1000) {
      const n = Math.min(1000, left);
      await queue.addBulk(Array.from({ length: n }, () => ({ name: 'bench', data: PAYLOAD, opts: JOB_OPTS })));
    }
    let completed = 0;
    let finished;
    const done = new Promise((resolve) => { finished = resolve; });
    const worker = new Worker(args.queue, async () => {}, { connection, concurrency: args.concurrency, autorun: false });
    worker.on('completed', () => {
      completed++;
      if (completed === args.jobs) finished(mark(args.serverPid));
    });
    worker.on('failed', (job, err) => { console.error('job failed', err); });
    await worker.waitUntilReady();
    const start = mark(args.serverPid);
    const running = worker.run();
    const end = await done;
    out.worker = result(args.jobs, start, end);
    await worker.close();
    await running;
  }

  await queue.close();
  out.pid = process.pid;
  out.client = `bullmq ${require('bullmq/package.json').version} + ioredis ${require('ioredis/package.json').version} (node ${process.version})`;
  process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(0));
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
