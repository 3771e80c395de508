console.log(JSON.stringify({ok: true}))
