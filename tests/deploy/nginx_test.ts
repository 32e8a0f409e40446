/**
 * deploy/ end to end: `deploy/start.sh` starts 3 instances (`--no-gpu`) and nginx on loopback
 * (free ports, a temporary prefix, no root needed); through nginx the test creates 30 caches
 * with PUT, checks that every call on a cache lands on the instance holding it (each answer
 * names its instance; the instances are also asked directly), kills one instance and shows that
 * only its caches fail (a 502 problem `instance_unavailable` naming the cache) while the others
 * and the routes without a cache keep answering, then moves a cache between the surviving
 * instances (GET .../data, PUT .../data on the target through `X-Attention-Instance`, a line in
 * moved_caches.map and `nginx -s reload`) and continues its sequence there against float64.
 * Skipped, saying so, where nginx is not installed (CI installs it: .ci/run).
 */
import assert from "node:assert/strict";
import { AttentionApiError, AttentionClient, createRequestOf } from "../../client/client.ts";
import { maxAbsDiff } from "../server/helpers.ts";
import { HeldSeq } from "../server/held_seq.ts";
import { deploy, NGINX } from "./nginx_deploy.ts";
import { alive, waitFor } from "./nginx_path.ts";

/** A moved_caches.map key matching `id` exactly, letter case included (README). */
const pinKey = (id: string) => `"~^${id.replaceAll(".", "\\.")}$"`;

if (!NGINX) {
  console.log("nginx_test: skipped: no nginx binary in PATH or /usr/sbin (apt-get install nginx)");
}

Deno.test({
  name: "nginx: 3 instances, 30 caches routed by id, one instance killed, one cache moved",
  ignore: NGINX === null,
  sanitizeResources: false,
  sanitizeOps: false,
  async fn() {
    const d = await deploy(3, ["--max-body-bytes", String(4 << 20)]);
    const { prefix, port, instances } = d;
    try {
      assert.deepEqual(instances.map((i) => i.name), ["i0", "i1", "i2"]);
      const url = `http://127.0.0.1:${port}`;
      const proxy = new AttentionClient(url);
      const direct = new Map(
        instances.map((i) => [i.name, new AttentionClient(`http://127.0.0.1:${i.port}`)]),
      );
      const via = (name: string) =>
        new AttentionClient(url, { headers: { "x-attention-instance": name } });

      // 30 caches through nginx: each PUT names the instance that created the cache.
      const owner = new Map<string, string>();
      const seqs = new Map<string, HeldSeq>();
      for (let i = 0; i < 30; i++) {
        const id = `cache-${String(i).padStart(2, "0")}`;
        const put = await proxy.putCache(id, HeldSeq.cacheSpec());
        assert.equal(put.created, true, id);
        assert.ok(put.instance && direct.has(put.instance), `${id}: instance ${put.instance}`);
        owner.set(id, put.instance);
        seqs.set(id, new HeldSeq());
      }
      const counts = instances.map((i) => [...owner.values()].filter((o) => o === i.name).length);
      assert.ok(counts.every((c) => c > 0), `every instance holds caches: ${counts}`);
      // The instances agree: each cache exists on its owner and nowhere else.
      for (const [id, name] of owner) {
        for (const [other, c] of direct) {
          const found = await c.getCache(id).then(() => true, (e) => {
            if (e instanceof AttentionApiError && e.status === 404) return false;
            throw e;
          });
          assert.equal(found, other === name, `${id} on ${other}`);
        }
      }
      // Every forward lands on the cache's instance and computes right.
      for (const [id, name] of owner) {
        const { body, ref } = seqs.get(id)!.step(3);
        const ans = await proxy.forwardOn(id, body, { binary: id.endsWith("7") });
        assert.equal(ans.instance, name, id);
        assert.ok(maxAbsDiff(ans.output.values, ref) < 2e-5, id);
      }

      // Kill the instance holding the fewest caches (not all of them: others must survive).
      const victim = instances[counts.indexOf(Math.min(...counts))];
      Deno.kill(victim.pid, "SIGKILL");
      await waitFor(`${victim.name} to exit`, 10_000, () => !alive(victim.pid));
      for (const [id, name] of owner) {
        if (name === victim.name) {
          const e = await proxy.forwardOn(id, seqs.get(id)!.step(1).body).then(
            () => assert.fail(`${id} on the killed ${name} answered`),
            (e) => e,
          );
          assert.ok(e instanceof AttentionApiError, String(e));
          assert.equal(e.status, 502, JSON.stringify(e.problem));
          assert.equal(e.code, "instance_unavailable");
          assert.equal(e.problem.cache_id, id);
          assert.match(e.problem.detail, new RegExp(`cache "${id}"`));
          seqs.delete(id);
          continue;
        }
        const { body, ref } = seqs.get(id)!.step(1);
        const ans = await proxy.forwardOn(id, body);
        assert.equal(ans.instance, name, id);
        assert.ok(maxAbsDiff(ans.output.values, ref) < 2e-5, id);
      }
      for (let i = 0; i < 6; i++) {
        const h = await proxy.health();
        assert.ok(h.instance && h.instance !== victim.name, `healthz from ${h.instance}`);
      }

      // Move one cache between the survivors: export, import on the target, pin, reload.
      const [from, to] = instances.filter((i) => i !== victim).map((i) => i.name);
      const id = [...owner].find(([, n]) => n === from)![0];
      const exported = await fetch(`${url}/v1/kv-caches/${id}/data`);
      assert.equal(exported.status, 200);
      assert.equal(exported.headers.get("x-attention-instance"), from);
      const file = new Uint8Array(await exported.arrayBuffer());
      const spec = createRequestOf(await proxy.getCache(id));
      const target = via(to);
      const put = await target.putCache(id, spec);
      assert.deepEqual([put.created, put.instance], [true, to]);
      await target.putCacheData(id, file);
      // Pins match case-sensitively (the README's form: nginx compares plain map keys without
      // case, and ids are case-sensitive): ten more ids pinned, their upper-case twins not.
      const twins = Array.from({ length: 10 }, (_, i) => `zzpin${i}`);
      const pins = [id, ...twins].map((c) => `${pinKey(c)} attn_${to};\n`).join("");
      await Deno.writeTextFile(`${prefix}/moved_caches.map`, pins);
      await d.reload();
      await via(from).deleteCache(id);
      await waitFor(`nginx to route ${id} to ${to}`, 10_000, async () => {
        const r = await fetch(`${url}/v1/kv-caches/${id}`);
        await r.body?.cancel();
        return r.status === 200 && r.headers.get("x-attention-instance") === to;
      });
      const twinsAt = await Promise.all(twins.map(async (c) => {
        const r = await fetch(`${url}/v1/kv-caches/${c.toUpperCase()}`);
        await r.body?.cancel();
        return r.headers.get("x-attention-instance");
      }));
      assert.ok(twinsAt.some((at) => at !== to), `upper-case twins all pinned: ${twinsAt}`);
      const { body, ref } = seqs.get(id)!.step(2);
      const ans = await proxy.forwardOn(id, body);
      assert.equal(ans.instance, to);
      assert.ok(maxAbsDiff(ans.output.values, ref) < 2e-5, "the moved cache kept its contents");
      // The other caches of the source instance stay where they were.
      const stay = [...owner].find(([c, n]) => n === from && c !== id);
      if (stay) assert.equal((await proxy.getCache(stay[0])).id, stay[0]);
    } finally {
      const st = await d.stop();
      assert.equal(st.signal ?? null, null, "start.sh stopped by its own trap");
    }
  },
});
