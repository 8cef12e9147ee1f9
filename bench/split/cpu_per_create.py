#!/usr/bin/env python3
"""CPU the tickets service spends per create, for comparing two builds of it: start each
binary, drive N keep-alive creates from one client, and read the process's utime+stime (all
its threads, dead ones included) before and after. The client's own CPU is not counted, and
a loaded machine slows the creates far more than it adds to their CPU.
On SQLite by default; with PG=postgres://user@host:port each run gets a fresh database on
that server, and the CPU of the service's backends (read from /proc, so the server must be
on this machine) is added to the service's.
Usage: [PG=…] N=3000 REPS=4 bench/split/cpu_per_create.py before=PATH/tickets after=PATH/tickets"""
import http.client, json, os, subprocess, sys, tempfile, time, uuid
PG=os.environ.get('PG')
def psql(db, sql):
    return subprocess.run(['psql','-X','-q','-t','-A',f'{PG}/{db}','-c',sql],check=True,capture_output=True,text=True).stdout
def proc_cpu(pid):
    try: f=open(f'/proc/{pid}/stat').read().rsplit(')',1)[1].split()
    except FileNotFoundError: return None
    return (int(f[11])+int(f[12]))/os.sysconf('SC_CLK_TCK')
def backends(db):
    """CPU seconds of each backend serving `db`, by pid."""
    pids=[int(x) for x in psql('postgres',f"SELECT pid FROM pg_stat_activity WHERE datname = '{db}'").split()]
    return {pid:c for pid in pids if (c:=proc_cpu(pid)) is not None}
def run(binary, layer, n, port):
    d=tempfile.mkdtemp(prefix='cpu-')
    env=dict(os.environ, TICKETS_ADDR=f'127.0.0.1:{port}', RETRYSAFE_DATA_DIR=d, RETRYSAFE_SANDBOX='true',
             RETRYSAFE_IDEMPOTENCY=layer, RUST_LOG='warn')
    env.pop('DATABASE_URL',None); env.pop('TICKETS_DATABASE_URL',None)
    db=None
    if PG:
        db=f'cpu_{uuid.uuid4().hex[:12]}'
        psql('postgres',f'CREATE DATABASE {db}')
        env['TICKETS_DATABASE_URL']=f'{PG}/{db}'
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
        a=proc_cpu(p.pid); ba=backends(db) if db else {}; t=time.time()
        for i in range(n): create(i)
        time.sleep(0.3)  # the journal's round after the last create
        b=proc_cpu(p.pid); bb=backends(db) if db else {}; w=time.time()-t
        # a backend that ended mid-run is not counted; one that began is, whole
        db_cpu=sum(c-ba.get(pid,0.0) for pid,c in bb.items())
        return (b-a+db_cpu)/n*1e6, w/n*1e6
    finally:
        p.terminate(); p.wait()
        if db: psql('postgres',f'DROP DATABASE {db} WITH (FORCE)')
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
