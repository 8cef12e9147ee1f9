#!/usr/bin/env python3
"""CPU the tickets service spends per create, for comparing two builds of it on SQLite:
start each binary, drive N keep-alive creates from one client, and read the process's
utime+stime (all its threads, dead ones included) before and after. The client's own CPU
is not counted, and a loaded machine slows the creates far more than it adds to their CPU.
Usage: N=3000 REPS=4 bench/split/cpu_per_create.py before=PATH/tickets after=PATH/tickets"""
import http.client, json, os, subprocess, sys, tempfile, time, uuid
def run(binary, layer, n, port):
    d=tempfile.mkdtemp(prefix='cpu-')
    env=dict(os.environ, TICKETS_ADDR=f'127.0.0.1:{port}', RETRYSAFE_DATA_DIR=d, RETRYSAFE_SANDBOX='true',
             RETRYSAFE_IDEMPOTENCY=layer, RUST_LOG='warn')
    env.pop('DATABASE_URL',None); env.pop('TICKETS_DATABASE_URL',None)
    p=subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                c=http.client.HTTPConnection('127.0.0.1',port,timeout=5); c.request('GET','/healthz'); r=c.getresponse(); r.read()
                if r.status==200: break
            except OSError: time.sleep(0.1)
        c=http.client.HTTPConnection('127.0.0.1',port,timeout=10)
        def create(i):
            body=json.dumps({"project":"ops","title":f"t{i} {uuid.uuid4().hex}","priority":"high"})
            c.request('POST','/v1/tickets',body,{'Authorization':'Bearer demo-acme-agent','Content-Type':'application/json','Idempotency-Key':uuid.uuid4().hex})
            r=c.getresponse(); r.read()
            assert r.status==201,(r.status)
        for i in range(500): create(i)
        time.sleep(0.5)
        def cpu():
            f=open(f'/proc/{p.pid}/stat').read().rsplit(')',1)[1].split()
            return (int(f[11])+int(f[12]))/os.sysconf('SC_CLK_TCK')
        a=cpu(); t=time.time()
        for i in range(n): create(i)
        time.sleep(0.3)  # the journal's round after the last create
        b=cpu(); w=time.time()-t
        return (b-a)/n*1e6, w/n*1e6
    finally:
        p.terminate(); p.wait()
if __name__=='__main__':
    sides=sys.argv[1:]  # name=binary
    n=int(os.environ.get('N','5000')); reps=int(os.environ.get('REPS','5'))
    res={}
    for r in range(reps):
        order=sides if r%2==0 else list(reversed(sides))
        for s in order:
            name,binary=s.split('=',1)
            for layer in ('on','off'):
                cpu_us,wall_us=run(binary,layer,n,18000+r)
                res.setdefault((name,layer),[]).append(cpu_us)
                print(f'rep {r} {name} layer={layer}: {cpu_us:.0f} µs CPU, {wall_us:.0f} µs wall a create; load {os.getloadavg()[0]:.1f}',flush=True)
    import statistics
    print('median CPU µs per create:')
    for k,v in sorted(res.items()): print(k, round(statistics.median(v)), sorted(round(x) for x in v))
