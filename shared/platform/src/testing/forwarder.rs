//! A TCP forwarder, standing in for the address a service reaches its
//! database by (a virtual IP, pgbouncer, HAProxy): a test cuts it to take the
//! database away, brings it back, or points it at another server.

use std::{
    net::SocketAddr,
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering},
    },
};

use tokio::{net::TcpListener, task::JoinHandle};

pub struct TcpForwarder {
    /// Where clients connect: `127.0.0.1:<port>`, the same across a cut.
    pub addr: SocketAddr,
    upstream: Arc<Mutex<SocketAddr>>,
    /// Connections taken so far, for tests that count what a service opens.
    accepted: Arc<AtomicUsize>,
    serving: tokio::sync::Mutex<Option<JoinHandle<()>>>,
}

impl TcpForwarder {
    /// Forwards a free loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> TcpForwarder {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a free loopback port");
        let forwarder = TcpForwarder {
            addr: listener.local_addr().unwrap(),
            upstream: Arc::new(Mutex::new(upstream)),
            accepted: Default::default(),
            serving: tokio::sync::Mutex::new(None),
        };
        *forwarder.serving.lock().await = Some(forwarder.serve(listener));
        forwarder
    }

    /// Closes every connection through it and refuses new ones, as a dead
    /// database host does.
    pub async fn cut(&self) {
        if let Some(serving) = self.serving.lock().await.take() {
            serving.abort();
            // the listener and every connection are dropped with the task
            let _ = serving.await;
        }
    }

    /// Takes connections again, on the same address.
    pub async fn restore(&self) {
        let mut serving = self.serving.lock().await;
        if serving.is_none() {
            let listener = TcpListener::bind(self.addr)
                .await
                .expect("the forwarder's own port again");
            *serving = Some(self.serve(listener));
        }
    }

    /// New connections go to `upstream` (a promoted standby); the ones open stay where they are.
    pub fn point_at(&self, upstream: SocketAddr) {
        *self.upstream.lock().unwrap() = upstream;
    }

    /// How many connections it has taken since it started.
    pub fn connections_accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    fn serve(&self, listener: TcpListener) -> JoinHandle<()> {
        let (upstream, accepted) = (self.upstream.clone(), self.accepted.clone());
        tokio::spawn(async move {
            // dropped with this task on a cut, which aborts every connection
            let mut connections = tokio::task::JoinSet::new();
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                accepted.fetch_add(1, Ordering::SeqCst);
                let to = *upstream.lock().unwrap();
                connections.spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(to).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                // reap the finished ones, so a long test holds no dead handles
                while connections.try_join_next().is_some() {}
            }
        })
    }
}
